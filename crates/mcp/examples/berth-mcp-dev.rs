//! Test driver for berth-mcp before the `berth` binary wires it in.
//!
//!   berth-mcp-dev stdio --state-dir DIR --public-url URL [--toolset T] [--user ID] [--session ID]
//!   berth-mcp-dev http  --state-dir DIR --listen ADDR [--toolset T]   (identity: X-Berth-User)
//!   berth-mcp-dev connect --state-dir DIR --user ID --api-url URL [--sandbox-url URL] < key
//!   berth-mcp-dev rotate-kek --state-dir DIR
//!
//! `--lease-ttl S` and `--sweep-interval S` shorten lease timing for tests.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use berth_mcp::{HeaderIdentity, Mcp, McpConfig};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args.next().context("missing command")?;
    let mut flags = HashMap::new();
    while let Some(flag) = args.next() {
        let name = flag
            .strip_prefix("--")
            .context("expected --flag")?
            .to_owned();
        flags.insert(name, args.next().context("flag without value")?);
    }
    let state_dir = PathBuf::from(flags.get("state-dir").context("--state-dir is required")?);
    let listen = flags
        .get("listen")
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let public_url = flags
        .get("public-url")
        .cloned()
        .unwrap_or_else(|| format!("http://{listen}"));
    let mut config = McpConfig::new(state_dir, &public_url);
    if let Some(toolset) = flags.get("toolset") {
        config.toolset = toolset.parse().map_err(anyhow::Error::msg)?;
    }
    if let Some(seconds) = flags.get("lease-ttl") {
        config.lease.ttl = Duration::from_secs(seconds.parse()?);
    }
    if let Some(seconds) = flags.get("sweep-interval") {
        config.lease.sweep_interval = Duration::from_secs(seconds.parse()?);
    }
    let user = flags
        .get("user")
        .cloned()
        .unwrap_or_else(berth_mcp::os_user);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        match command.as_str() {
            "stdio" => Ok(berth_mcp::run_stdio(config, user, flags.get("session").cloned()).await?),
            "http" => {
                let mcp = Mcp::open(config)?;
                let _sweeper = mcp.spawn_sweeper(Default::default());
                let router = mcp.http_router(Arc::new(HeaderIdentity::default()));
                let listener = tokio::net::TcpListener::bind(&listen).await?;
                println!("listening on http://{}", listener.local_addr()?);
                axum::serve(listener, router).await?;
                Ok(())
            }
            "connect" => {
                let api_url = flags.get("api-url").context("--api-url is required")?;
                berth_mcp::run_connect(
                    config,
                    &user,
                    api_url,
                    flags.get("sandbox-url").map(String::as_str),
                )
                .await?;
                eprintln!("connected {user} to {api_url}");
                Ok(())
            }
            "rotate-kek" => {
                let report = Mcp::open(config)?.rotate_kek()?;
                eprintln!(
                    "key-encryption key version {}; {} records re-encrypted",
                    report.kek_version, report.records_reencrypted
                );
                Ok(())
            }
            other => bail!("unknown command {other}"),
        }
    })
}
