"""Writes a Parquet file of text documents shaped like FineWeb's (an int64 'id' and a string 'text' column, row
groups of 1,000 documents of 30 to 1,500 words): the input of run_read_bench.sh.

usage: make_text_parquet.py FILE [TEXT_BYTES (100000000)] [COMPRESSION (snappy)]
"""
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq

path = sys.argv[1]
text_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000_000
compression = sys.argv[3] if len(sys.argv) > 3 else "snappy"

rng = random.Random(0)
letters = "etaoinshrdlucmfwypvbgkjqxz\u00e9"
vocabulary = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 10))) for _ in range(20000)]
documents, total = [], 0
while total < text_bytes:
    document = " ".join(rng.choices(vocabulary, k=rng.randint(30, 1500))) + "."
    documents.append(document)
    total += len(document.encode())
table = pa.table({"id": pa.array(range(len(documents)), pa.int64()), "text": pa.array(documents, pa.string())})
pq.write_table(table, path, compression=compression, row_group_size=1000)
print(f"{path}: {len(documents)} documents, {total} bytes of text, {compression}")
