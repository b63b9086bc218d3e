#!/usr/bin/env python3
"""Print the executables a `cargo ... --message-format=json` build reports.

    cargo test --release --no-run --message-format=json | scripts/cargo-executables.py --tests
    cargo bench --no-run --message-format=json | scripts/cargo-executables.py --target gpu_kernels

--tests keeps test binaries (integration tests and the library's unit
tests); --target NAME keeps the target of that name. Each path once, sorted.
"""
import argparse
import json
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--tests", action="store_true", help="test binaries only")
parser.add_argument("--target", help="only the target of this name")
args = parser.parse_args()

found = set()
for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if message.get("reason") != "compiler-artifact" or not message.get("executable"):
        continue
    if args.tests and not message.get("profile", {}).get("test"):
        continue
    if args.target and message.get("target", {}).get("name") != args.target:
        continue
    found.add(message["executable"])
for path in sorted(found):
    print(path)
