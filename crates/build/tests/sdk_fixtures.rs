//! What the real Python SDK (e2b 2.63.0) sends, recorded by `fixtures/sdk-2.63/make.py`
//! from a context of: `app/main.py`, `app/hard.py` (a hard link to it),
//! `app/entry.py -> main.py`, `app/mods -> lib`, `app/lib/u.py` (0755), `c.json`.
//! The build body parses, and berth recomputes the SDK's `filesHash` of each upload.

use std::path::Path;

use berth_build::files::sdk_files_hash;
use berth_build::{BuildBase, E2bBuildStart};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sdk-2.63")
        .join(name)
}

#[test]
fn the_sdk_build_body_parses_and_its_files_hashes_are_recomputed() {
    let body: E2bBuildStart =
        serde_json::from_slice(&std::fs::read(fixture("body.json")).unwrap()).unwrap();
    let request = body.into_request("b", "t", "team", (1, 512, 1024));
    assert_eq!(request.base, BuildBase::Template("base".into()));
    assert_eq!(request.start_cmd.as_deref(), Some("python3 -m http.server"));
    assert_eq!(request.ready_cmd.as_deref(), Some("curl -s localhost:8000"));
    let kinds: Vec<&str> = request.steps.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["COPY", "COPY", "RUN", "ENV", "WORKDIR", "RUN", "RUN", "USER"]
    );
    for (index, step) in request.steps.iter().enumerate() {
        let Some(hash) = &step.files_hash else {
            continue;
        };
        let upload = fixture(&format!("upload{index}.tar.gz"));
        let recomputed = sdk_files_hash(&step.args[0], &step.args[1], &upload).unwrap();
        assert_eq!(&recomputed, hash, "step {index} {:?}", step.args);
    }
}
