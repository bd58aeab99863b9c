"""Signatures in cosign 3's default format (Sigstore bundles), made the way cosign 3 makes them
with a key, by a second implementation of its code (cmd/cosign/cli/sign/sign.go's
signDigestBundle, pkg/oci/remote/write.go's WriteAttestationNewBundleFormat and WriteReferrer)
on the `cryptography` package: what a plugin author's `cosign sign --key` attaches to an image,
and what `cosign sign-blob --key --bundle` writes for a blob.

    cosign3.py attach REGISTRY/REPO@DIGEST KEY.pem [PREDICATE_TYPE]
        Sign DIGEST (a DSSE envelope of an in-toto Statement v1 with PREDICATE_TYPE, cosign's
        `https://sigstore.dev/cosign/sign/v1` by default) and attach the bundle as an OCI 1.1
        referrer: a manifest pushed by digest whose subject is DIGEST; where the registry answers
        without `OCI-Subject` (no referrers API), the referrers tag `sha256-<hex>` index is
        updated, as go-containerregistry does for cosign (remote/write.go: the entry's
        artifactType is the config's media type). Print the referrer's digest.
    cosign3.py junk REGISTRY/REPO@DIGEST KEY.pem
        Attach a referrer as `attach` does whose bundle is 100 KiB of junk.
    cosign3.py sign-blob FILE KEY.pem
        Print the bundle of FILE (a messageSignature over its bytes).
"""

import base64
import hashlib
import json
import sys

import requests
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
IN_TOTO = "application/vnd.in-toto+json"
SIGN = "https://sigstore.dev/cosign/sign/v1"


def b64(data):
    return base64.b64encode(data).decode()


def load_key(path):
    with open(path, "rb") as f:
        return serialization.load_pem_private_key(f.read(), password=None)


def hint(key):
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return b64(hashlib.sha256(der).digest())


def sign(key, data):
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def pae(payload_type, payload):
    return b"DSSEv1 %d %s %d %s" % (
        len(payload_type),
        payload_type.encode(),
        len(payload),
        payload,
    )


def image_bundle(key, hex_digest, predicate_type):
    # protojson's field order for an in-toto v1 Statement and ResourceDescriptor.
    statement = json.dumps(
        {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": hex_digest}, "annotations": {}}],
            "predicateType": predicate_type,
            "predicate": {},
        },
        separators=(",", ":"),
    ).encode()
    return json.dumps(
        {
            "mediaType": BUNDLE,
            "verificationMaterial": {"publicKey": {"hint": hint(key)}},
            "dsseEnvelope": {
                "payload": b64(statement),
                "payloadType": IN_TOTO,
                "signatures": [{"sig": b64(sign(key, pae(IN_TOTO, statement)))}],
            },
        },
        separators=(",", ":"),
    ).encode()


def blob_bundle(key, data):
    return json.dumps(
        {
            "mediaType": BUNDLE,
            "verificationMaterial": {"publicKey": {"hint": hint(key)}},
            "messageSignature": {
                "messageDigest": {"algorithm": "SHA2_256", "digest": b64(hashlib.sha256(data).digest())},
                "signature": b64(sign(key, data)),
            },
        },
        separators=(",", ":"),
    )


def put_blob(base, repo, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = requests.post(f"{base}/{repo}/blobs/uploads/", timeout=30)
    start.raise_for_status()
    location = start.headers["Location"]
    if location.startswith("/"):
        location = base.rsplit("/v2", 1)[0] + location
    sep = "&" if "?" in location else "?"
    done = requests.put(
        f"{location}{sep}digest={digest}",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    done.raise_for_status()
    return {"digest": digest, "size": len(data)}


def attach(reference, key_path, predicate_type, junk=False):
    registry, rest = reference.split("/", 1)
    repo, digest = rest.split("@", 1)
    base = f"http://{registry}/v2"
    key = load_key(key_path)
    head = requests.head(
        f"{base}/{repo}/manifests/{digest}", headers={"Accept": MANIFEST}, timeout=30
    )
    head.raise_for_status()
    subject = {
        "mediaType": head.headers.get("Content-Type", MANIFEST),
        "digest": digest,
        "size": int(head.headers["Content-Length"]),
    }
    signed = image_bundle(key, digest.split(":", 1)[1], predicate_type)
    # A referrer no verifier should read: 100 KiB where a bundle is a few.
    bundle = put_blob(base, repo, b"{" + b" " * (100 << 10) + b"}" if junk else signed)
    config = put_blob(base, repo, b"{}")
    annotations = {
        "org.opencontainers.image.created": "2026-12-06T00:00:00Z",
        "dev.sigstore.bundle.content": "dsse-envelope",
        "dev.sigstore.bundle.predicateType": predicate_type,
    }
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": EMPTY, "artifactType": BUNDLE, **config},
            "layers": [{"mediaType": BUNDLE, **bundle}],
            "subject": subject,
            "annotations": annotations,
            "artifactType": BUNDLE,
        },
        separators=(",", ":"),
    ).encode()
    referrer = "sha256:" + hashlib.sha256(manifest).hexdigest()
    put = requests.put(
        f"{base}/{repo}/manifests/{referrer}",
        data=manifest,
        headers={"Content-Type": MANIFEST},
        timeout=30,
    )
    put.raise_for_status()
    # go-containerregistry asks the referrers API; without one (not 200), it keeps the tag.
    api = requests.get(f"{base}/{repo}/referrers/{digest}", headers={"Accept": INDEX}, timeout=30)
    if api.status_code != 200:
        tag = digest.replace(":", "-")
        got = requests.get(f"{base}/{repo}/manifests/{tag}", headers={"Accept": INDEX}, timeout=30)
        index = got.json() if got.ok else {"schemaVersion": 2, "mediaType": INDEX, "manifests": []}
        # As go-containerregistry (cosign's registry library) writes the referrers tag
        # (remote/write.go commitManifest): the entry's artifactType is the config's media type
        # (it reads no top-level artifactType), no annotations, entries sorted by digest.
        if all(m["digest"] != referrer for m in index["manifests"]):
            index["manifests"].append(
                {
                    "artifactType": EMPTY,
                    "mediaType": MANIFEST,
                    "digest": referrer,
                    "size": len(manifest),
                }
            )
        index["manifests"].sort(key=lambda m: m["digest"])
        requests.put(
            f"{base}/{repo}/manifests/{tag}",
            data=json.dumps(index).encode(),
            headers={"Content-Type": INDEX},
            timeout=30,
        ).raise_for_status()
    print(referrer)


def main(argv):
    if len(argv) == 4 and argv[1] == "junk":
        attach(argv[2], argv[3], SIGN, junk=True)
        return 0
    if len(argv) in (4, 5) and argv[1] == "attach":
        attach(argv[2], argv[3], argv[4] if len(argv) == 5 else SIGN)
        return 0
    if len(argv) == 4 and argv[1] == "sign-blob":
        with open(argv[2], "rb") as f:
            print(blob_bundle(load_key(argv[3]), f.read()))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
