use clap::Parser;

/// berth's in-sandbox daemon.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:49983")]
    listen: String,
}

fn main() -> anyhow::Result<()> {
    let _args = Args::parse();
    Ok(())
}
