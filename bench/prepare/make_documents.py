#!/usr/bin/env python3
"""Documents for run_prepare_bench.sh: a text's paragraphs (the KJV's chapters: its verses joined by spaces, the
"Ge1:1" references dropped; another text's blank-line-separated paragraphs) repeated to about TARGET_MB of text,
written twice: as JSON Lines ({"text": ...} per line, for prepare) and one document per line (for the tokenizer's
own single-thread timing, which encodes each line in one call).

  make_documents.py TEXT TARGET_MB OUT_JSONL OUT_LINES   -> prints {"documents": ..., "text_bytes": ...}
"""
import json
import re
import sys

text_path, target_mb, out_jsonl, out_lines = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
with open(text_path, encoding="utf-8") as file:
    text = file.read()
verse = re.compile(r"^([0-9]?[A-Za-z]+)(\d+):\d+ (.*)$")
paragraphs, current, chapter = [], [], None
if all(verse.match(line) for line in text.splitlines()[:10] if line.strip()):
    for line in text.splitlines():
        match = verse.match(line)
        if not match:
            continue
        if (match[1], match[2]) != chapter and current:
            paragraphs.append(" ".join(current))
            current = []
        chapter = (match[1], match[2])
        current.append(match[3])
    if current:
        paragraphs.append(" ".join(current))
else:
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]

documents, size = [], 0
while size < target_mb * 1e6:
    for paragraph in paragraphs:
        documents.append(paragraph)
        size += len(paragraph.encode("utf-8"))
with open(out_jsonl, "w", encoding="utf-8") as jsonl, open(out_lines, "w", encoding="utf-8") as lines:
    for document in documents:
        jsonl.write(json.dumps({"text": document}, ensure_ascii=False) + "\n")
        lines.write(document + "\n")
print(json.dumps({"documents": len(documents), "text_bytes": size}))
