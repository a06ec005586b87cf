-- What a merchant's identity provider signs for oncepay (issue 54), set by
-- `oncepay merchant identity`:
-- - `token_type`: the one `typ` its tokens must carry (`at+jwt`, say;
--   compared as a media type: case-insensitive, `application/` implied).
--   NULL: no `typ`, `JWT` or `at+jwt`; any other kind of token the same
--   provider signs with the same keys (`logout+jwt`, `secevent+jwt`, ...)
--   is refused either way, so one cannot be replayed as a sign-in.
-- - `algorithms`: the algorithms it signs with, a subset of the four
--   oncepay verifies. An RSA key of its JWKS that names no `alg` verifies
--   one of them only (RS256, or PS256 where RS256 is not listed).
-- The defaults keep what every provider set before this accepted, less an
-- alg-less RSA key verifying PS256 as well as RS256.
ALTER TABLE merchant_identity
    ADD COLUMN token_type text
        CHECK (token_type IS NULL OR length(token_type) BETWEEN 1 AND 100),
    ADD COLUMN algorithms text[] NOT NULL
        DEFAULT ARRAY['RS256', 'PS256', 'ES256', 'EdDSA']
        CHECK (cardinality(algorithms) BETWEEN 1 AND 4
               AND algorithms <@ ARRAY['RS256', 'PS256', 'ES256', 'EdDSA']);
