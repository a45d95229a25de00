#!/usr/bin/env python3
"""Validate a JSON document against a JSON Schema file, in the draft the schema names.

Usage:
  validate_json_schema.py SCHEMA.json < document.json

Exit status 0 when valid; 1 with every error (its path and message) on stderr.
"""

import json
import sys

# As in validate_oci.py: jsonschema would import rfc3987_syntax (about 3 s of CPU) for the
# `iri` format alone.
sys.modules.setdefault("rfc3987_syntax", None)

import jsonschema


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        schema = json.load(f)
    document = json.load(sys.stdin)
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.path])
    for e in errors:
        where = "/".join(str(p) for p in e.path) or "(top)"
        print(f"{where}: {e.message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
