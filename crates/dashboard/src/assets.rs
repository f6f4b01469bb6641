//! Static files, embedded in the binary at build time (`assets/`, with the browser
//! libraries `vendor-assets.sh` copied from npm into `assets/vendor/`).

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// (name, content type, bytes).
const FILES: &[(&str, &str, &[u8])] = &[
    ("app.js", JS, include_bytes!("../assets/app.js")),
    ("app.css", CSS, include_bytes!("../assets/app.css")),
    ("xterm.js", JS, include_bytes!("../assets/vendor/xterm.js")),
    (
        "xterm.css",
        CSS,
        include_bytes!("../assets/vendor/xterm.css"),
    ),
    (
        "addon-fit.js",
        JS,
        include_bytes!("../assets/vendor/addon-fit.js"),
    ),
    ("uplot.js", JS, include_bytes!("../assets/vendor/uplot.js")),
    (
        "uplot.css",
        CSS,
        include_bytes!("../assets/vendor/uplot.css"),
    ),
];

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

pub async fn serve(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(file, _, _)| *file == name) {
        Some((_, content_type, bytes)) => (
            [
                (CONTENT_TYPE, *content_type),
                (CACHE_CONTROL, "no-cache"),
                (X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            *bytes,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendored_libraries_are_embedded() {
        let find = |name: &str| FILES.iter().find(|(file, _, _)| *file == name).unwrap().2;
        assert!(std::str::from_utf8(find("xterm.js"))
            .unwrap()
            .contains("Terminal"));
        assert!(std::str::from_utf8(find("uplot.js"))
            .unwrap()
            .contains("uPlot"));
    }
}
