"""Writes the Parquet files tests/unit/data/test_parquet_text.cpp reads, with pyarrow (scripts/setup.sh parquet
puts it in build/venv), and the documents they hold as JSON Lines, which the test reads independently of Parquet.

usage: write_fixtures.py FOLDER
"""
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq

folder = sys.argv[1]

# 2,500 documents in row groups of 1,000 (the last one partial): empty, multi-byte UTF-8, and one of 300 kB
# that spans several data pages.
documents = [f"document {i}: " + "word " * (i % 13) for i in range(2500)]
documents[7] = ""
documents[1001] = "h\u00e9llo w\u00f6rld \U0001F680 \u4e2d\u6587\n\ttabs and a newline"
documents[2222] = "long " * 60000
ids = pa.array(range(len(documents)), pa.int64())

with open(f"{folder}/documents.jsonl", "w", encoding="utf-8") as out:
    for text in documents:
        out.write(json.dumps({"text": text}) + "\n")

pq.write_table(pa.table({"id": ids, "text": pa.array(documents, pa.string())}), f"{folder}/documents.parquet",
               row_group_size=1000, compression="zstd")
# The same text as Arrow's large_string (Parquet stores both as BYTE_ARRAY with the String annotation), snappy,
# plain-encoded (no dictionary).
pq.write_table(pa.table({"text": pa.array(documents, pa.large_string()), "id": ids}), f"{folder}/large.parquet",
               row_group_size=1000, compression="snappy", use_dictionary=False)
# No rows at all.
pq.write_table(pa.table({"text": pa.array([], pa.string())}), f"{folder}/empty.parquet")

# Bad files: a null document (row 1234, in the second row group), columns of other types, a truncated file, a
# damaged page in a file whose writer stored page checksums.
with_null = list(documents)
with_null[1234] = None
pq.write_table(pa.table({"text": pa.array(with_null, pa.string())}), f"{folder}/null.parquet", row_group_size=1000)
pq.write_table(pa.table({"text": pa.array([b"\x00\x01"] * 10, pa.binary())}), f"{folder}/binary.parquet")
pq.write_table(pa.table({"text": pa.array(range(10), pa.int64())}), f"{folder}/integers.parquet")
pq.write_table(pa.table({"text": pa.array([["a", "b"]] * 10, pa.list_(pa.string()))}), f"{folder}/list.parquet")

with open(f"{folder}/documents.parquet", "rb") as whole:
    data = whole.read()
with open(f"{folder}/truncated.parquet", "wb") as out:
    out.write(data[: len(data) // 2])

pq.write_table(pa.table({"text": pa.array(documents, pa.string())}), f"{folder}/checksummed.parquet",
               row_group_size=1000, compression="none", write_page_checksum=True)
page = pq.ParquetFile(f"{folder}/checksummed.parquet").metadata.row_group(1).column(0).data_page_offset
with open(f"{folder}/checksummed.parquet", "rb") as whole:
    data = bytearray(whole.read())
for i in range(page + 200, page + 264):  # inside the first data page of row group 1, past its header
    data[i] ^= 0x5A
with open(f"{folder}/damaged_page.parquet", "wb") as out:
    out.write(data)
