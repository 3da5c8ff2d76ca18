#!/usr/bin/env python3
"""Independent reader for meshtrain's hand-encoded TensorBoard event files, using the official
`tensorboard` package (pip install tensorboard; TensorFlow not needed).

Usage: read_events.py DIR
Prints one JSON object: {"files": [...], "file_versions": [...], "records": N,
"scalars": [{"tag", "step", "value", "wall_time"}, ...]}. Exits non-zero on a bad record.

Two passes, because EventAccumulator alone would hide framing errors: its loader treats a CRC
mismatch as a truncated tail and silently stops reading. So every record is first read with the
strict record reader (raises DataLossError on a header or data CRC mismatch) and parsed with the
official Event proto; then the scalars come from EventAccumulator, the path the TensorBoard UI uses.
"""
import glob
import json
import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow


def strict_records(path):
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return
        yield reader.record()


def json_number(value):
    # JSON has no NaN / infinity: name them so the output stays parseable.
    return value if math.isfinite(value) else str(value)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: read_events.py DIR")
    directory = sys.argv[1]
    files = sorted(glob.glob(os.path.join(directory, "*tfevents*")))
    if not files:
        sys.exit(f"{directory}: no *tfevents* files")
    file_versions, records = [], 0
    for path in files:
        for data in strict_records(path):
            event = event_pb2.Event.FromString(data)
            records += 1
            if event.HasField("file_version"):
                file_versions.append(event.file_version)

    accumulator = EventAccumulator(directory, size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    scalars = []
    for tag in sorted(accumulator.Tags()["scalars"]):
        for point in accumulator.Scalars(tag):
            scalars.append(
                {"tag": tag, "step": point.step, "value": json_number(point.value), "wall_time": point.wall_time}
            )
    print(
        json.dumps(
            {
                "files": [os.path.basename(path) for path in files],
                "file_versions": file_versions,
                "records": records,
                "scalars": scalars,
            }
        )
    )


if __name__ == "__main__":
    main()
