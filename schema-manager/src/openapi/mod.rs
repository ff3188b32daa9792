//! CRDs synthesized from a provider's OpenAPI v3 documents (REFERENCE-BEHAVIOUR §10, OAPI-1 …
//! OAPI-7), improved: `$ref` is resolved fully, with only a genuine cycle becoming an open object
//! (LIM-5); `allOf`/`anyOf`/`oneOf`/`not`/`additionalProperties`/`items` are descended into
//! (QRK-24); shortNames and categories come from discovery (PGAP-13); and the result is always a
//! structural schema the API server accepts.

pub mod fetch;
mod synthesis;

pub use synthesis::*;
