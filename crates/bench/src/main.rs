//! berth-bench: start-latency and density benchmark for the Linux runtime.

fn main() -> anyhow::Result<()> {
    Ok(())
}
