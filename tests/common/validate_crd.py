#!/usr/bin/env python3
"""Validate custom resources against their CRD's openAPIV3Schema, strictly.

Usage:
  validate_crd.py CRD.yaml < objects.json     (a JSON object or a JSON array of objects)

Strict means what `kubectl apply --validate=strict` means: besides types, enums, required
fields and formats, a field the schema does not declare is an error (an API server would prune
it silently; a renderer that writes a misspelt field must fail its test), except under
`x-kubernetes-preserve-unknown-fields` or `additionalProperties`. `x-kubernetes-int-or-string`
accepts integers and strings. Exit status 0 when valid; 1 with every error on stderr.
"""

import json
import sys

# jsonschema imports rfc3987_syntax when it is installed (cyclonedx-python-lib's validation
# brings it), which builds a grammar for about 3 s of CPU at import, for the `iri` format
# alone: no schema here uses it. Without the stub every run of this script paid it.
sys.modules.setdefault("rfc3987_syntax", None)

import jsonschema
import yaml


def strict(schema):
    """A JSON Schema for `schema` (an OpenAPI v3 structural schema) that refuses unknown fields."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = strict(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [strict(s) for s in value]
        elif key == "nullable" or key.startswith("x-kubernetes-"):
            continue
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if out.get("type") == "object" and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        crd = next(d for d in yaml.safe_load_all(f) if d and d.get("kind") == "CustomResourceDefinition")
    group = crd["spec"]["group"]
    kind = crd["spec"]["names"]["kind"]
    versions = {v["name"]: strict(v["schema"]["openAPIV3Schema"]) for v in crd["spec"]["versions"]}
    objects = json.load(sys.stdin)
    if isinstance(objects, dict):
        objects = [objects]
    errors = []
    for obj in objects:
        api_version = obj.get("apiVersion", "")
        g, _, v = api_version.rpartition("/")
        name = obj.get("metadata", {}).get("name", "?")
        if g != group or obj.get("kind") != kind or v not in versions:
            errors.append(f"{kind} {name}: apiVersion {api_version!r}, kind {obj.get('kind')!r} is not in this CRD")
            continue
        # apiVersion, kind and metadata are implicit in every CRD: the API server checks them
        # itself, whether the schema declares them or not.
        schema = dict(versions[v])
        schema["properties"] = dict(schema.get("properties", {}))
        schema["properties"]["metadata"] = {"type": "object"}
        schema["properties"]["apiVersion"] = {"type": "string"}
        schema["properties"]["kind"] = {"type": "string"}
        validator = jsonschema.Draft7Validator(schema)
        for e in validator.iter_errors(obj):
            path = ".".join(str(p) for p in e.absolute_path)
            errors.append(f"{kind} {name}: {path or '(root)'}: {e.message}")
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
