"""Security: who is calling (TLS, SCRAM, JWT, mTLS), what they may do (Kafka's ACL model), and node-to-node calls.

The pieces are small and mostly pure, so the HTTP layer (``cluster.http.auth``)
and the controller (users and ACLs in its replicated state) stay thin adapters:

- ``principals``: principal names and where the HTTP layer keeps the caller's identity on a request.
- ``acl``: the ACL model (resource types, operations, patterns, bindings, filters) and its JSON form.
- ``authorizer``: Kafka's authorization rules over ACLs indexed by resource.
- ``scram``: SCRAM-SHA-256/512 credentials (RFC 5802/7677 keys; never a password).
- ``credentials``: checking HTTP Basic against SCRAM credentials, with a small cache of verified ones.
- ``jwt_auth``: bearer tokens (PyJWT, fixed algorithms, required iss/aud/exp, keys from a JWKS).
- ``node_calls``: node-to-node calls signed per request (method, path, body hash, principal, time, nonce).
- ``tls``: the SSL contexts of the HTTP listener and of node-to-node calls.
- ``certs``: a CA and node certificates for ``cluster init --secure``.
- ``secure_init``: what ``cluster init --secure`` writes (certificates, ``[security]`` sections, ``admin.toml``).
"""
