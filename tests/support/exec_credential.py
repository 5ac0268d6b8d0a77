"""An exec credential plugin for tests, as kubeconfig's `users[].user.exec` runs one: asks the
TokenRequest API for a token of a service account bound to a new Secret (deleting the Secret
revokes the token), and prints it as an ExecCredential. Each run appends a line to COUNT:
the Secret's name and the token.

usage: exec_credential.py SERVER CA ADMIN_TOKEN_FILE NAMESPACE ACCOUNT API_VERSION COUNT
"""

from __future__ import annotations

import json
import ssl
import sys
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any


def call(server: str, ctx: ssl.SSLContext, admin: str, path: str, body: Any) -> Any:
    req = urllib.request.Request(server + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {admin}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
        return json.loads(resp.read())


def main(argv: list[str]) -> int:
    server, ca, admin_file, ns, account, api_version, count = argv
    ctx = ssl.create_default_context(cafile=ca)
    admin = open(admin_file).read().strip()  # noqa: SIM115 - a one-shot script
    secret = call(server, ctx, admin, f"/api/v1/namespaces/{ns}/secrets",
                  {"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": f"fw-exec-{uuid.uuid4().hex[:8]}", "namespace": ns}})
    meta = secret["metadata"]
    out = call(server, ctx, admin, f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token",
               {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 600,
                         "boundObjectRef": {"kind": "Secret", "apiVersion": "v1",
                                            "name": meta["name"], "uid": meta["uid"]}}})
    with open(count, "a") as fh:
        fh.write(f"{meta['name']} {out['status']['token']}\n")
    expires = datetime.now(UTC) + timedelta(seconds=600)
    print(json.dumps({"apiVersion": api_version, "kind": "ExecCredential",
                      "status": {"token": out["status"]["token"],
                                 "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
