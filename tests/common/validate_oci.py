#!/usr/bin/env python3
"""Validate OCI image-spec documents against the JSON schemas in tests/fixtures/oci-schemas.

Usage:
  validate_oci.py KIND FILE      KIND = manifest | index | config | layout; FILE may be '-' (stdin)
  validate_oci.py tree DIR       validate a whole OCI image layout directory: oci-layout,
                                 index.json, every reachable index / manifest / config, and the
                                 sha256/sha512 digest and size of every referenced blob

Exit status 0 when valid; 1 with every error on stderr when invalid; 2 on usage errors.
"""

import hashlib
import json
import os
import re
import sys

# jsonschema imports rfc3987_syntax when it is installed (cyclonedx-python-lib's validation
# brings it), which builds a grammar for about 3 s of CPU at import, for the `iri` format
# alone: no schema here uses it. Without the stub every run of this script paid it.
sys.modules.setdefault("rfc3987_syntax", None)

import jsonschema
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource
from referencing.jsonschema import DRAFT4

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA_DIR = os.path.normpath(os.path.join(HERE, "..", "fixtures", "oci-schemas"))

SCHEMA_FILES = {
    "manifest": "image-manifest-schema.json",
    "index": "image-index-schema.json",
    "config": "config-schema.json",
    "layout": "image-layout-schema.json",
}

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
CONFIG_TYPES = (
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
)

RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def load_schema(name):
    with open(os.path.join(SCHEMA_DIR, name), encoding="utf-8") as f:
        return json.load(f)


def retrieve(uri):
    """Map any schema URI (http(s)://opencontainers.org/schema/.../NAME.json) to a local file.

    The schemas use ids such as https://opencontainers.org/schema/image/manifest and relative
    $refs such as defs-descriptor.json, so the resolved URIs vary with the base id in force.
    Only the final path segment matters.
    """
    name = uri.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if not name.endswith(".json"):
        name += ".json"
    path = os.path.join(SCHEMA_DIR, name)
    if not os.path.isfile(path):
        raise NoSuchResource(ref=uri)
    return Resource.from_contents(load_schema(name), default_specification=DRAFT4)


FORMAT_CHECKER = jsonschema.FormatChecker(formats=())


@FORMAT_CHECKER.checks("date-time")
def is_date_time(value):
    return not isinstance(value, str) or bool(RFC3339.match(value))


def schema_errors(kind, doc):
    """Return a list of error strings (empty when valid)."""
    if kind not in SCHEMA_FILES:
        raise SystemExit(f"unknown kind {kind!r}; expected one of {sorted(SCHEMA_FILES)}")
    schema = load_schema(SCHEMA_FILES[kind])
    registry = Registry(retrieve=retrieve)
    validator = jsonschema.Draft4Validator(
        schema, registry=registry, format_checker=FORMAT_CHECKER
    )
    errors = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        errors.append(f"{kind}: {where}: {err.message}")
    return errors


def parse_json(raw, what):
    try:
        return json.loads(raw), []
    except (ValueError, UnicodeDecodeError) as e:
        return None, [f"{what}: not valid JSON: {e}"]


class Tree:
    """Walks an OCI image layout and collects every problem found."""

    def __init__(self, root):
        self.root = root
        self.errors = []
        self.seen = set()

    def blob(self, desc, where):
        """Return the bytes of the blob a descriptor names, checking digest and size."""
        digest = desc.get("digest")
        if not isinstance(digest, str) or ":" not in digest:
            self.errors.append(f"{where}: descriptor has no valid digest: {desc!r}")
            return None
        alg, hexd = digest.split(":", 1)
        if alg not in ("sha256", "sha512"):
            self.errors.append(f"{where}: unsupported digest algorithm {alg}")
            return None
        path = os.path.join(self.root, "blobs", alg, hexd)
        if not os.path.isfile(path):
            self.errors.append(f"{where}: blob {digest} missing ({path})")
            return None
        h = hashlib.new(alg)
        size = 0
        keep = bytearray()
        small = desc.get("mediaType") not in LAYER_LIKE and desc.get("size", 0) < (64 << 20)
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
                if small:
                    keep.extend(chunk)
        if h.hexdigest() != hexd:
            self.errors.append(f"{where}: blob {digest} has digest {alg}:{h.hexdigest()}")
        if desc.get("size") != size:
            self.errors.append(
                f"{where}: blob {digest} is {size} bytes, descriptor says {desc.get('size')!r}"
            )
        return bytes(keep) if small else None

    def document(self, kind, desc, where):
        raw = self.blob(desc, where)
        if raw is None:
            return None
        doc, errs = parse_json(raw, where)
        self.errors.extend(errs)
        if doc is None:
            return None
        self.errors.extend(f"{where}: {e}" for e in schema_errors(kind, doc))
        if not isinstance(doc, dict):
            return None
        inner = doc.get("mediaType")
        if kind != "config" and inner is not None and inner != desc.get("mediaType"):
            self.errors.append(
                f"{where}: mediaType {inner!r} differs from descriptor {desc.get('mediaType')!r}"
            )
        return doc

    def visit(self, desc, where):
        if not isinstance(desc, dict):
            self.errors.append(f"{where}: descriptor is not an object")
            return
        key = desc.get("digest")
        if key in self.seen:
            return
        self.seen.add(key)
        mt = desc.get("mediaType")
        if mt in INDEX_TYPES:
            doc = self.document("index", desc, where)
            if doc is not None:
                for i, d in enumerate(doc.get("manifests") or []):
                    self.visit(d, f"{where} > manifests[{i}] {d.get('digest') if isinstance(d, dict) else ''}")
        elif mt in MANIFEST_TYPES:
            doc = self.document("manifest", desc, where)
            if doc is None:
                return
            cfg = doc.get("config")
            if isinstance(cfg, dict):
                if cfg.get("mediaType") in CONFIG_TYPES:
                    self.document("config", cfg, f"{where} > config")
                else:
                    self.blob(cfg, f"{where} > config")
            for i, layer in enumerate(doc.get("layers") or []):
                if isinstance(layer, dict):
                    self.blob(layer, f"{where} > layers[{i}]")
        else:
            self.errors.append(f"{where}: unknown manifest mediaType {mt!r}")

    def run(self):
        layout_file = os.path.join(self.root, "oci-layout")
        index_file = os.path.join(self.root, "index.json")
        for kind, path in (("layout", layout_file), ("index", index_file)):
            if not os.path.isfile(path):
                self.errors.append(f"{path}: missing")
                continue
            with open(path, "rb") as f:
                doc, errs = parse_json(f.read(), path)
            self.errors.extend(errs)
            if doc is None:
                continue
            self.errors.extend(f"{path}: {e}" for e in schema_errors(kind, doc))
            if kind == "index" and isinstance(doc, dict):
                for i, d in enumerate(doc.get("manifests") or []):
                    self.visit(d, f"index.json manifests[{i}]")
        return self.errors


LAYER_LIKE = (
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    kind, target = argv[1], argv[2]
    if kind == "tree":
        errors = Tree(target).run()
    else:
        if kind not in SCHEMA_FILES:
            print(f"unknown kind {kind!r}", file=sys.stderr)
            return 2
        if target == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(target, "rb") as f:
                raw = f.read()
        doc, errors = parse_json(raw, target)
        if doc is not None:
            errors = schema_errors(kind, doc)
    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
