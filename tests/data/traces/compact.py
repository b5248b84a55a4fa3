"""Copy a `paraplan validate --out DIR` folder into a small test fixture: report.json as it is, each
rank's trace with only the fields paraplan.validation.trace reads (complete events: ph, cat, name,
pid, tid, ts, dur; the metadata's distributedInfo), gzipped.

    python tests/data/traces/compact.py OUT_DIR tests/data/traces/NAME
"""
import gzip
import json
import os
import shutil
import sys

KEEP = ("ph", "cat", "name", "pid", "tid", "ts", "dur")


def compact(src: str, dest: str) -> None:
    os.makedirs(os.path.join(dest, "traces"), exist_ok=True)
    shutil.copy(os.path.join(src, "report.json"), os.path.join(dest, "report.json"))
    for name in sorted(os.listdir(os.path.join(src, "traces"))):
        with open(os.path.join(src, "traces", name)) as f:
            data = json.load(f)
        events = [{k: e[k] for k in KEEP if k in e} for e in data["traceEvents"] if e.get("ph") == "X"]
        for e in events:
            e["ts"], e["dur"] = round(e["ts"], 3), round(e["dur"], 3)
        small = {"schemaVersion": data.get("schemaVersion"), "distributedInfo": data.get("distributedInfo"),
                 "traceEvents": events}
        with gzip.open(os.path.join(dest, "traces", name + ".gz"), "wt") as f:
            json.dump(small, f, separators=(",", ":"))


if __name__ == "__main__":
    compact(sys.argv[1], sys.argv[2])
