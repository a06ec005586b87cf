"""Keys and tokens for tests/api/identity.rs, made by PyJWT and cryptography
(a JOSE implementation nobody in oncepay wrote), never by oncepay's own code.

Reads one JSON request on stdin, writes one JSON answer on stdout:
- {"keygen": ["RS256", "PS256", "ES256", "EdDSA", ...]}
  -> [{"private_pem", "public_pem", "jwk"}, ...] (the JWK without kid/alg);
- {"sign": [{"alg", "key" (a private PEM), "headers", "claims"}, ...]}
  -> ["<token>", ...]. `alg: none` signs nothing; `alg: HS256` with `key`
  a public PEM makes the classic confusion token: HMAC-SHA256 keyed by the
  public key's bytes (PyJWT itself refuses a PEM as an HMAC secret, so
  the HMAC is the standard library's, over PyJWT's own encoding).
"""
import base64
import hashlib
import hmac
import json
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm


def keygen(alg):
    if alg in ("RS256", "PS256"):
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    elif alg == "ES256":
        key = ec.generate_private_key(ec.SECP256R1())
        jwk = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    elif alg == "EdDSA":
        key = ed25519.Ed25519PrivateKey.generate()
        jwk = OKPAlgorithm.to_jwk(key.public_key(), as_dict=True)
    else:
        raise SystemExit(f"no key for {alg}")
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(
            serialization.Encoding.PEM,
            serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        .decode()
    )
    return {"private_pem": private_pem, "public_pem": public_pem, "jwk": jwk}


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(request):
    alg = request["alg"]
    headers = request.get("headers", {})
    claims = request["claims"]
    if alg == "none":
        return jwt.encode(claims, None, algorithm="none", headers=headers)
    if alg == "HS256":
        unsigned = jwt.encode(claims, None, algorithm="none", headers=headers)
        header = json.loads(base64.urlsafe_b64decode(unsigned.split(".")[0] + "=="))
        header["alg"] = "HS256"
        head = b64(json.dumps(header, separators=(",", ":")).encode())
        body = unsigned.split(".")[1]
        message = f"{head}.{body}".encode()
        mac = hmac.new(request["key"].encode(), message, hashlib.sha256).digest()
        return f"{head}.{body}.{b64(mac)}"
    return jwt.encode(claims, request["key"], algorithm=alg, headers=headers)


def main():
    request = json.load(sys.stdin)
    if "keygen" in request:
        answer = [keygen(alg) for alg in request["keygen"]]
    else:
        answer = [sign(r) for r in request["sign"]]
    json.dump(answer, sys.stdout)


main()
