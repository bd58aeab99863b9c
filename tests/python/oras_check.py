"""Plugin artifacts through the ORAS project's own Python client (oras-py, from PyPI).

    oras_check.py pull REFERENCE OUTDIR
        Pull REFERENCE (pinned by digest) with oras; print the files it wrote, one per line.
    oras_check.py manifest REFERENCE
        Print the manifest REFERENCE names (a tag or a digest).
    oras_check.py config REFERENCE
        Print the config blob of the manifest REFERENCE (pinned by digest) names.
    oras_check.py push FILE CONFIG REFERENCE [LAYER_TYPE]
        Push FILE as an `application/wasm` layer (or LAYER_TYPE) with CONFIG as the
        `application/vnd.wasm.config.v0+json` config, as an author pushing with oras does;
        print the pushed manifest's digest (the registry's Docker-Content-Digest).
"""

import json
import os
import sys

import oras.client
import requests

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def client(reference):
    registry = reference.split("/", 1)[0]
    return oras.client.OrasClient(hostname=registry, insecure=True)


def main(argv):
    if len(argv) == 4 and argv[1] == "pull":
        files = client(argv[2]).pull(target=argv[2], outdir=argv[3], allowed_media_type=[])
        for f in files:
            print(f)
        return 0
    if len(argv) == 3 and argv[1] == "manifest":
        print(json.dumps(client(argv[2]).get_manifest(argv[2])))
        return 0
    if len(argv) == 3 and argv[1] == "config":
        c = client(argv[2])
        manifest = c.get_manifest(argv[2])
        registry, rest = argv[2].split("/", 1)
        repository = rest.split("@", 1)[0]
        blob = requests.get(
            f"http://{registry}/v2/{repository}/blobs/{manifest['config']['digest']}", timeout=30
        )
        blob.raise_for_status()
        print(blob.text)
        return 0
    if len(argv) in (5, 6) and argv[1] == "push":
        path, config, reference = argv[2], argv[3], argv[4]
        layer_type = argv[5] if len(argv) == 6 else "application/wasm"
        os.chdir(os.path.dirname(os.path.abspath(path)))
        response = client(reference).push(
            target=reference,
            files=[os.path.basename(path) + ":" + layer_type],
            manifest_config=os.path.abspath(config) + ":application/vnd.wasm.config.v0+json",
            disable_path_validation=True,
            quiet=True,
        )
        response.raise_for_status()
        registry, rest = reference.split("/", 1)
        repository, tag = rest.rsplit(":", 1)
        head = requests.head(
            f"http://{registry}/v2/{repository}/manifests/{tag}",
            headers={"Accept": MANIFEST},
            timeout=30,
        )
        head.raise_for_status()
        print(head.headers["Docker-Content-Digest"])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
