//! The egress interception CA is installed into sandboxes' trust store and pointed at by
//! their init's environment, once per bundle however often the sandbox boots. Privileged.

mod common;

use berth_runtime::Runtime;
use common::checkpoint::KillGuard;
use common::TestRuntime;

const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIBberthtestcaAAAA\n-----END CERTIFICATE-----";

#[test]
fn sandboxes_trust_the_egress_ca_through_bundle_and_environment() {
    let t = TestRuntime::new();
    t.rt.set_egress_ca(Some(PEM.to_string()));
    let sandbox = t.rt.create(&t.spec("ca")).unwrap();
    let _guard = KillGuard {
        rt: &t.rt,
        id: sandbox.id.clone(),
    };
    let id = sandbox.id.as_str();
    assert_eq!(
        t.sh_ok(
            id,
            0,
            "cat /usr/local/share/ca-certificates/berth-egress-ca.crt"
        ),
        PEM
    );
    let count = |t: &TestRuntime| {
        t.sh_ok(
            id,
            0,
            "grep -c MIIBberthtestcaAAAA /etc/ssl/certs/ca-certificates.crt",
        )
    };
    assert_eq!(count(&t), "1");
    let environ = std::fs::read(format!("/proc/{}/environ", sandbox.init_pid)).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    for var in [
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
        "NODE_EXTRA_CA_CERTS=/usr/local/share/ca-certificates/berth-egress-ca.crt",
    ] {
        assert!(environ.contains(var), "{var} missing from {environ:?}");
    }
    // A boot on the kept disk does not append it again.
    t.rt.pause_filesystem(id).unwrap();
    t.rt.resume_paused_filesystem(id).unwrap();
    assert_eq!(count(&t), "1");
}
