"""Parses a YAML request body with PyYAML's C extension (libyaml) and answers with JSON."""
import yaml


def main(event, context):
    text = event.get("data") or "{}"
    if isinstance(text, bytes):
        text = text.decode()
    return {"parsed": yaml.safe_load(text), "libyaml": yaml.__with_libyaml__}
