//! What a sandbox can and cannot see or do. Privileged: run as root.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use berth_runtime::Runtime;
use common::{unique, TestRuntime};

#[test]
fn host_processes_and_files_are_invisible() {
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("iso")).unwrap();
    // Only the init, the shell and what it runs exist in the sandbox's pid namespace.
    let comms = t.sh_ok(
        &info.id,
        0,
        "cat /proc/[0-9]*/comm 2>/dev/null | sort -u | tr '\\n' ' '",
    );
    for comm in comms.split_whitespace() {
        assert!(
            ["sleep", "sh", "cat", "sort", "tr"].contains(&comm),
            "foreign process {comm} visible: {comms}"
        );
    }
    assert_eq!(t.sh_ok(&info.id, 0, "cat /proc/1/comm"), "sleep");
    let marker = std::path::Path::new("/tmp").join(unique("berth-host-marker"));
    std::fs::write(&marker, "host secret").unwrap();
    let result = t.sh(&info.id, 0, &format!("test -e {}", marker.display()));
    std::fs::remove_file(&marker).unwrap();
    assert!(!result.status.success(), "host file visible inside");
    for path in [
        "/work",
        "/var/lib/berth",
        "/var/lib/berth-test",
        "/dev/vda",
        "/dev/loop-control",
        "/dev/kmsg",
        "/dev/mem",
    ] {
        assert!(
            !t.sh(&info.id, 0, &format!("test -e {path}"))
                .status
                .success(),
            "{path} visible inside"
        );
    }
    let devices = t.sh_ok(&info.id, 0, "ls /dev | sort | tr '\\n' ' '");
    assert_eq!(
        devices,
        "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero"
    );
}

/// Each probe prints `name:errno` (0 = allowed); run as namespaced root.
const PROBES: &str = r#"
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(f"{name}:{0 if r >= 0 else ctypes.get_errno()}")
sc("mount", 165, b"none", b"/mnt", b"tmpfs", 0, None)
sc("umount", 166, b"/proc", 0)
sc("init_module", 175, None, 0, b"")
sc("finit_module", 313, 0, b"", 0)
sc("delete_module", 176, b"loop", 0)
sc("kexec_load", 246, 0, 0, None, 0)
sc("kexec_file_load", 320, -1, -1, 0, None, 0)
sc("unshare_user", 272, 0x10000000)
sc("unshare_net", 272, 0x40000000)
sc("bpf", 321, 0, None, 0)
sc("open_tree", 428, -100, b"/", 1)
sc("fsopen", 430, b"tmpfs", 0)
sc("pivot_root", 155, b"/", b"/")
sc("reboot", 169, 0xfee1dead, 672274793, 0x1234567, None)
sc("keyctl", 250, 0, 0)
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("raw_socket:0")
except OSError as e: print(f"raw_socket:{e.errno}")
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0); print("packet_socket:0")
except OSError as e: print(f"packet_socket:{e.errno}")
for path in ["/proc/sys/net/ipv4/ip_forward", "/proc/sys/kernel/hostname", "/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled"]:
    try:
        with open(path, "w") as f: f.write("1")
        print(f"write {path}:0")
    except OSError as e: print(f"write {path}:{e.errno}")
for path in ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"]:
    if os.path.exists(path):
        print(f"masked {path}:{int(open(path, 'rb').read(1) == b'')}")
for path in ["/proc/acpi", "/proc/scsi", "/sys/firmware"]:
    if os.path.exists(path):
        print(f"masked {path}:{int(os.listdir(path) == [])}")
        try:
            open(path + "/probe", "w"); print(f"write {path}/probe:0")
        except OSError as e: print(f"write {path}/probe:{e.errno}")
"#;

#[test]
fn privileged_operations_are_refused() {
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("priv")).unwrap();
    let out = t.sh_ok(
        &info.id,
        0,
        &format!("python3 -c '{}'", PROBES.replace('\'', "'\\''")),
    );
    eprintln!("{out}");
    for line in out.lines() {
        let (name, value) = line.rsplit_once(':').unwrap();
        let value: i64 = value.parse().unwrap();
        match name {
            masked if masked.starts_with("masked ") => assert_eq!(value, 1, "{name} not masked"),
            _ => assert_ne!(value, 0, "{name} was allowed inside the sandbox:\n{out}"),
        }
    }
    assert!(out.lines().count() >= 20, "probes did not all run:\n{out}");
    // Shared memory works for the unprivileged user (/dev/shm is a directory of /run's
    // tmpfs) while the masks stay read-only.
    assert_eq!(
        t.sh_ok(
            &info.id,
            1000,
            "echo shared > /dev/shm/probe && cat /dev/shm/probe"
        ),
        "shared"
    );
    // The mount binary fails too (it goes through the same syscalls).
    assert!(!t
        .sh(&info.id, 0, "mount -t tmpfs none /mnt")
        .status
        .success());
}

#[test]
fn host_loopback_is_unreachable_and_connect_reaches_the_sandbox() {
    let t = TestRuntime::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let info = t.rt.create(&t.spec("net")).unwrap();
    let probe = format!(
        "python3 -c 'import socket; s=socket.socket(); s.settimeout(2)\ntry:\n s.connect((\"127.0.0.1\", {port})); print(\"reached\")\nexcept OSError as e: print(\"refused\", e)'"
    );
    let out = t.sh_ok(&info.id, 0, &probe);
    assert!(
        out.starts_with("refused"),
        "host listener reachable from the sandbox: {out}"
    );
    // Only loopback exists inside.
    let links = t.sh_ok(&info.id, 0, "ls /sys/class/net | tr '\\n' ' '");
    assert_eq!(links, "lo");

    // A server inside is reachable through Runtime::connect and nowhere else.
    t.sh_ok(
        &info.id,
        1000,
        "cd /tmp && python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 0.01",
    );
    let mut stream = None;
    for _ in 0..200 {
        match t.rt.connect(&info.id, 8080) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(25)),
        }
    }
    let mut stream = stream.expect("connect to the sandbox's server");
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
}

#[test]
fn neighbours_are_unreachable_and_invisible() {
    let t = TestRuntime::new();
    let a = t.rt.create(&t.spec("nba")).unwrap();
    let b = t.rt.create(&t.spec("nbb")).unwrap();
    t.sh_ok(
        &a.id,
        0,
        "echo secret > /root/a-secret && echo secret > /tmp/a-secret",
    );
    t.sh_ok(
        &a.id,
        0,
        "python3 -m http.server 8081 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 0.01",
    );
    // Wait until A's server answers from inside A.
    let mut up = false;
    for _ in 0..200 {
        if t.rt.connect(&a.id, 8081).is_ok() {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(up, "server in A never came up");
    assert!(
        t.rt.connect(&b.id, 8081).is_err(),
        "A's port reachable in B's namespace"
    );
    let out = t.sh_ok(
        &b.id,
        0,
        "python3 -c 'import socket; s=socket.socket()\ntry:\n s.connect((\"127.0.0.1\", 8081)); print(\"reached\")\nexcept OSError: print(\"refused\")'",
    );
    assert_eq!(out, "refused");
    for path in ["/root/a-secret", "/tmp/a-secret"] {
        assert!(
            !t.sh(&b.id, 0, &format!("test -e {path}")).status.success(),
            "{path} of A visible in B"
        );
    }
    let procs = t.sh_ok(&b.id, 0, "cat /proc/[0-9]*/comm | sort -u | tr '\\n' ' '");
    assert!(
        !procs.contains("python"),
        "A's processes visible in B: {procs}"
    );
}
