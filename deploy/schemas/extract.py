#!/usr/bin/env python3
"""Writes the openAPIV3Schema of each served version of the CustomResourceDefinitions named
on the command line into deploy/schemas/<group>_<plural>.json, the form scripts/deploy-check
reads. Run with the CRD files of the releases SOURCES.md names (a Helm template's
`{{ ... }}` lines are dropped first):

    extract.py --source 'istio/istio 1.30.3 manifests/charts/base/files/crd-all.gen.yaml' \
        crd-all.gen.yaml wasmplugins.extensions.istio.io ...
"""
import argparse
import json
import pathlib

import yaml


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--source", required=True, help="repository, release and path, for the record")
    p.add_argument("--version", help="keep this version only (default: every served one)")
    p.add_argument("file")
    p.add_argument("names", nargs="+", help="CRD names (plural.group) to keep")
    a = p.parse_args()
    text = "\n".join(
        line for line in pathlib.Path(a.file).read_text().splitlines() if not line.lstrip().startswith("{{")
    )
    found = {}
    for doc in yaml.safe_load_all(text):
        if doc and doc.get("kind") == "CustomResourceDefinition" and doc["metadata"]["name"] in a.names:
            found[doc["metadata"]["name"]] = doc
    out_dir = pathlib.Path(__file__).parent
    for name in a.names:
        crd = found[name]
        spec = crd["spec"]
        versions = {
            v["name"]: v["schema"]["openAPIV3Schema"] for v in spec["versions"] if v.get("served", True) and a.version in (None, v["name"])
        }
        record = {
            "source": a.source,
            "group": spec["group"],
            "kind": spec["names"]["kind"],
            "versions": versions,
        }
        path = out_dir / f"{spec['group']}_{spec['names']['plural']}.json"
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"{path.name}: {spec['names']['kind']} {', '.join(versions)}")


if __name__ == "__main__":
    main()
