//! `berth install`: a systemd unit running `berth up` at boot, and the env file it reads
//! its settings from (`/etc/default/berth`, kept when it exists: it is the operator's).
//! `--root DIR` writes into DIR instead of `/` (packaging, tests) and enables with
//! `systemctl --root`, which needs no running systemd. On a host whose PID 1 is systemd
//! the unit is also loaded (`daemon-reload`) and, with `--now`, started.
//!
//! The unit stops `berth up` with SIGTERM only (`KillMode=mixed` would SIGKILL the rest
//! of its group): sandboxes live in berth's own cgroups and survive a restart, which
//! recovery reattaches.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

const UNIT_NAME: &str = "berth.service";

#[derive(Args)]
pub struct InstallArgs {
    /// Write under this directory instead of `/`.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// Address `berth up` listens on (written to the env file when it is created).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: String,
    /// Do not enable the unit.
    #[arg(long)]
    no_enable: bool,
    /// Also start it now (needs systemd as PID 1).
    #[arg(long)]
    now: bool,
}

/// The unit text for `binary` (absolute).
fn unit(binary: &Path) -> String {
    format!(
        "[Unit]
Description=berth: self-hosted, E2B-compatible sandboxes
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
EnvironmentFile=-/etc/default/berth
ExecStart={binary} up
# Re-reads the limits config file (BERTH_CONFIG) without a restart.
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=2
# SIGTERM to berth up only: sandboxes run in berth's own cgroups and are reattached
# after a restart.
KillMode=process
TimeoutStopSec=30
LimitNOFILE=1048576
TasksMax=infinity

[Install]
WantedBy=multi-user.target
",
        binary = binary.display()
    )
}

fn env_file(state_dir: &Path, listen: &str) -> String {
    format!(
        "# Settings of berth up (see `berth up --help`: every flag has a BERTH_* variable).
BERTH_STATE_DIR={}
BERTH_LISTEN={listen}
# BERTH_METRICS_LISTEN=127.0.0.1:9090
# State in Postgres instead of berth.db (this file is 0600: it may hold the password).
# BERTH_DATABASE_URL=postgres://berth@%2Frun%2Fpostgresql/berth
# PGPASSWORD=
# BERTH_EGRESS_ALLOW=
# Limits, quotas and retention: flags below, or a TOML file re-read on
# `systemctl reload berth` (README, section Limits).
# BERTH_CONFIG=/etc/berth/limits.toml
# BERTH_TEAM_MAX_SANDBOXES=
# BERTH_MAX_SANDBOX_LIFETIME=86400
# BERTH_LOG_FORMAT=json
",
        state_dir.display()
    )
}

/// `path` under `root` (`/etc/x` under `/tmp/r` is `/tmp/r/etc/x`).
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

fn write(path: &Path, text: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let staging = path.with_extension("berth-tmp");
    std::fs::write(&staging, text).with_context(|| format!("writing {}", staging.display()))?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&staging, path).with_context(|| format!("writing {}", path.display()))
}

fn systemctl(root: &Path, args: &[&str]) -> Result<()> {
    let mut command = Command::new("systemctl");
    if root != Path::new("/") {
        command.arg(format!("--root={}", root.display()));
    }
    let status = command
        .args(args)
        .status()
        .context("running systemctl (is systemd installed?)")?;
    if !status.success() {
        bail!("systemctl {} failed ({status})", args.join(" "));
    }
    Ok(())
}

pub fn run(state_dir: &Path, args: InstallArgs) -> Result<()> {
    let systemd_running = args.root == Path::new("/") && Path::new("/run/systemd/system").is_dir();
    if args.now && !systemd_running {
        bail!(
            "systemd is not running here (PID 1 is not systemd, or --root is set): drop --now, \
             or start `berth up` yourself"
        );
    }
    let binary = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .context("finding this binary")?;
    let unit_path = under(&args.root, "/etc/systemd/system/berth.service");
    write(&unit_path, &unit(&binary), 0o644)?;
    eprintln!("wrote {}", unit_path.display());
    let env_path = under(&args.root, "/etc/default/berth");
    if env_path.exists() {
        eprintln!("kept {} (the operator's settings)", env_path.display());
    } else {
        write(&env_path, &env_file(state_dir, &args.listen), 0o600)?;
        eprintln!("wrote {}", env_path.display());
    }
    if systemd_running {
        systemctl(&args.root, &["daemon-reload"])?;
    }
    if !args.no_enable {
        systemctl(&args.root, &["enable", UNIT_NAME])?;
    }
    if args.now {
        systemctl(&args.root, &["restart", UNIT_NAME])?;
        eprintln!("started {UNIT_NAME}");
    } else if !systemd_running && args.root == Path::new("/") {
        eprintln!("systemd is not PID 1 here: the unit takes effect on a systemd boot");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_runs_this_binary_and_stops_only_berth_up() {
        let text = unit(Path::new("/usr/local/bin/berth"));
        assert!(text.contains("ExecStart=/usr/local/bin/berth up\n"));
        assert!(text.contains("KillMode=process\n"));
        assert!(text.contains("ExecReload=/bin/kill -HUP $MAINPID\n"));
        assert!(text.contains("EnvironmentFile=-/etc/default/berth\n"));
        assert_eq!(
            under(Path::new("/tmp/r"), "/etc/default/berth"),
            Path::new("/tmp/r/etc/default/berth")
        );
    }
}
