//! `berth up`'s template builds: the build engine on the daemon's runtime and template
//! store, with the operator's settings (concurrency, registry mirrors, maximum
//! resources a template may ask for).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use berth_build::{BuildEngine, EngineConfig};
use berth_oci::{ImagePuller, PullerConfig};
use berth_runtime::LinuxRuntime;
use berth_server::TemplateLimits;
use berth_template::TemplateStore;
use clap::Args;

#[derive(Args)]
pub struct BuildArgs {
    /// Template builds running at once (more wait).
    #[arg(long, env = "BERTH_MAX_CONCURRENT_BUILDS", default_value_t = 2)]
    max_concurrent_builds: usize,
    /// Most CPUs a template (and so its sandboxes) may ask for.
    #[arg(long, env = "BERTH_TEMPLATE_MAX_CPUS", default_value_t = 8)]
    template_max_cpus: u32,
    /// Most memory a template may ask for, MiB.
    #[arg(long, env = "BERTH_TEMPLATE_MAX_MEMORY_MB", default_value_t = 16384)]
    template_max_memory_mb: u64,
    /// Largest sandbox disk a template may ask for, MiB.
    #[arg(long, env = "BERTH_TEMPLATE_MAX_DISK_MB", default_value_t = 65536)]
    template_max_disk_mb: u64,
    /// Pull images of REGISTRY from URL instead: `docker.io=http://127.0.0.1:5000`.
    /// Repeatable; comma-separated in the env.
    #[arg(
        long = "registry-mirror",
        env = "BERTH_REGISTRY_MIRRORS",
        value_delimiter = ','
    )]
    registry_mirrors: Vec<String>,
    /// Registries (host[:port]) spoken to over plain http besides loopback ones.
    #[arg(
        long = "insecure-registry",
        env = "BERTH_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    insecure_registries: Vec<String>,
}

impl BuildArgs {
    pub fn limits(&self) -> TemplateLimits {
        TemplateLimits {
            max_cpu_count: self.template_max_cpus,
            max_memory_mb: self.template_max_memory_mb,
            max_disk_size_mb: self.template_max_disk_mb,
        }
    }

    fn puller(&self) -> Result<ImagePuller> {
        let mut mirrors = BTreeMap::new();
        for mirror in &self.registry_mirrors {
            let Some((registry, url)) = mirror.split_once('=') else {
                bail!("--registry-mirror {mirror:?}: expected REGISTRY=URL");
            };
            mirrors.insert(registry.to_string(), url.to_string());
        }
        ImagePuller::new(PullerConfig {
            mirrors,
            insecure_registries: self.insecure_registries.clone(),
        })
        .context("setting up image pulls")
    }
}

/// The build engine of `berth up`: builds left unfinished by a previous run are marked
/// failed (and reported), leftover build sandboxes killed.
pub fn engine(
    state_dir: &Path,
    runtime: Arc<LinuxRuntime>,
    templates: TemplateStore,
    args: &BuildArgs,
) -> Result<BuildEngine> {
    let mut config = EngineConfig::new(state_dir);
    config.max_concurrent_builds = args.max_concurrent_builds.max(1);
    let (engine, interrupted) = BuildEngine::new(config, runtime, templates, args.puller()?)
        .context("starting template builds")?;
    for build in interrupted {
        eprintln!(
            "template build {} of {} was interrupted by the restart; it is marked failed",
            build.build_id, build.template_id
        );
    }
    Ok(engine)
}
