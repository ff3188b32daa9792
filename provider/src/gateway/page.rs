//! The gateway's web page: browse the catalog, log in, bind, then download the bundle or copy
//! the `kubectl` command that applies it. Static files built into the program; every answer
//! carries a Content-Security-Policy that allows this origin's own script and style only, no
//! framing, no inline code — the page keeps nothing in the browser's storage (its session is an
//! HTTP-only cookie it cannot read; the CSRF token stays in the page's memory).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/page.js");
const STYLE: &str = include_str!("page/page.css");

/// The policy every page answer carries.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /`.
pub(super) async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

/// `GET /assets/page.js`.
pub(super) async fn script() -> Response {
    file("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /assets/page.css`.
pub(super) async fn style() -> Response {
    file("text/css; charset=utf-8", STYLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_inline_code_and_labels_every_input() {
        // The policy forbids inline script and style: the page must not need them.
        assert!(!INDEX.contains("<script>"), "no inline script");
        assert!(!INDEX.contains("style="), "no inline style");
        assert!(!INDEX.contains("onclick"), "no inline handlers");
        // Every input sits inside its label; the document says its language.
        assert_eq!(
            INDEX.matches("<input").count(),
            INDEX.matches("<label>").count()
        );
        assert!(INDEX.contains("<html lang=\"en\">"));
        // Nothing kept in the browser's storage.
        for storage in [
            "localStorage",
            "sessionStorage",
            "document.cookie",
            "indexedDB",
        ] {
            assert!(!SCRIPT.contains(storage), "{storage}");
        }
        // Text from the catalog is set as text, never parsed as HTML.
        assert!(!SCRIPT.contains("innerHTML"), "no innerHTML");
    }
}
