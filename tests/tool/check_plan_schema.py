#!/usr/bin/env python3
"""Validates plan files against docs/plan.schema.json (JSON Schema 2020-12).

Usage: check_plan_schema.py SCHEMA FILE...  -> exit 0 when every FILE is valid, 1 naming the
first invalid one and why. With --expect-invalid, exit 0 only when every FILE is invalid
(so the check itself is shown able to fail).
"""
import json
import sys

import jsonschema


def main(argv):
    expect_invalid = "--expect-invalid" in argv
    args = [a for a in argv if a != "--expect-invalid"]
    schema = json.load(open(args[0]))
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    if len(args) < 2:
        print("check_plan_schema: no plan files given", file=sys.stderr)
        return 1
    for path in args[1:]:
        errors = sorted(validator.iter_errors(json.load(open(path))), key=lambda e: list(e.path))
        if expect_invalid and not errors:
            print(f"check_plan_schema: {path} is valid, expected invalid", file=sys.stderr)
            return 1
        if not expect_invalid and errors:
            e = errors[0]
            where = ".".join(str(p) for p in e.path) or "(document)"
            print(f"check_plan_schema: {path}: {where}: {e.message}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
