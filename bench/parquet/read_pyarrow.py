"""The peer of bench_parquet_read.cpp: pyarrow's own streaming read of one string column (iter_batches), the
documents counted and their bytes summed without leaving Arrow, then once more as Python str per document.

usage: read_pyarrow.py FILE COLUMN
"""
import sys
import time

import pyarrow.compute as pc
import pyarrow.parquet as pq

path, column = sys.argv[1], sys.argv[2]
start = time.perf_counter()
documents = text_bytes = 0
for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=[column]):
    documents += len(batch)
    text_bytes += pc.sum(pc.binary_length(batch.column(0))).as_py() or 0
seconds = time.perf_counter() - start
print(f"pyarrow iter_batches: {documents} documents, {text_bytes} bytes, {seconds:.3f} s")
start = time.perf_counter()
for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=[column]):
    for text in batch.column(0).to_pylist():
        pass
seconds = time.perf_counter() - start
print(f"pyarrow iter_batches + str: {documents} documents, {text_bytes} bytes, {seconds:.3f} s")
