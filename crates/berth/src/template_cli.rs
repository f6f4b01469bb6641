//! `berth template build|ls|rm`: template management over the REST API (any
//! E2B-compatible endpoint, `berth up` by default), with live step progress and logs.
//!
//! A build goes as the SDKs do it: `POST /v3/templates`, one upload per COPY source
//! that the server does not have yet (packed and hashed by berth-build's
//! `pack_copy_source`, exactly as the server recomputes it), `POST
//! /v2/templates/{id}/builds/{bid}`, then status polls with `logsOffset` until ready
//! or failed. Ctrl-C cancels the build on the server before exiting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use berth_api::{TemplateBuildRequestV3, TemplateBuildStartV2, TemplateBuildStatus, TemplateStep};
use berth_client::ApiClient;
use clap::{Args, Subcommand};

use crate::remote::{print_json, Remote};

/// How often a build's status is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(300);

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Build a template from a Dockerfile, an image or another template.
    Build(BuildArgs),
    /// List the templates the team sees (installed on the host and its own).
    #[command(alias = "list")]
    Ls,
    /// Delete one of the team's templates (by name or id) and the files only it used,
    /// or a snapshot by its name.
    #[command(alias = "delete")]
    Rm {
        /// Template name or id.
        template: String,
    },
}

#[derive(Args)]
pub struct BuildArgs {
    /// Template name, optionally with a tag: `name` or `name:tag`.
    #[arg(long)]
    name: String,
    /// The Dockerfile (single stage) to build; COPY sources are read from --path.
    #[arg(short = 'f', long, conflicts_with_all = ["from_image", "from_template"])]
    file: Option<PathBuf>,
    /// Start from this OCI image (e.g. `127.0.0.1:5000/app:1`).
    #[arg(long, conflicts_with = "from_template")]
    from_image: Option<String>,
    /// Start from this template (e.g. `base`).
    #[arg(long)]
    from_template: Option<String>,
    /// Build context for the Dockerfile's COPY sources (default: the Dockerfile's
    /// directory).
    #[arg(long)]
    path: Option<PathBuf>,
    /// More tags for the build.
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// Command started in every sandbox (its sandboxes start from a checkpoint where it
    /// is ready).
    #[arg(long)]
    start_cmd: Option<String>,
    /// Command that succeeds once the start command is ready.
    #[arg(long)]
    ready_cmd: Option<String>,
    #[arg(long)]
    cpu_count: Option<u32>,
    #[arg(long)]
    memory_mb: Option<u64>,
    /// Rebuild every step, ignoring the cache.
    #[arg(long)]
    no_cache: bool,
}

pub async fn run(remote: &Remote, command: TemplateCommand) -> Result<()> {
    match command {
        TemplateCommand::Build(args) => build(remote, args).await,
        TemplateCommand::Ls => list(remote).await,
        TemplateCommand::Rm { template } => {
            remote
                .client
                .delete_template(&template)
                .await
                .map_err(|err| remote.explain(err, &format!("deleting template {template}")))?;
            eprintln!("deleted template {template}");
            Ok(())
        }
    }
}

async fn list(remote: &Remote) -> Result<()> {
    let client = &remote.client;
    let mut templates = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = client
            .list_templates(Some(100), token.as_deref())
            .await
            .map_err(|err| remote.explain(err, "listing templates"))?;
        templates.extend(page.items);
        match page.next_token {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    if remote.json {
        return print_json(&templates);
    }
    println!(
        "{:<22}  {:<28}  {:<7}  {:>4}  {:>7}  {:>8}  {:<8}  BUILD",
        "ID", "NAME", "ACCESS", "CPUS", "MEM MiB", "DISK MiB", "STATUS"
    );
    for t in &templates {
        println!(
            "{:<22}  {:<28}  {:<7}  {:>4}  {:>7}  {:>8}  {:<8}  {}",
            t.template_id,
            t.names.join(","),
            if t.public { "public" } else { "private" },
            t.cpu_count,
            t.memory_mb,
            t.disk_size_mb,
            format!("{:?}", t.build_status).to_lowercase(),
            t.build_id
        );
    }
    Ok(())
}

/// The build body and the directory COPY sources are read from.
struct Plan {
    body: TemplateBuildStartV2,
    context: PathBuf,
}

fn plan(args: &BuildArgs) -> Result<Plan> {
    let mut body = TemplateBuildStartV2 {
        force: args.no_cache.then_some(true),
        ..TemplateBuildStartV2::default()
    };
    let mut context = args.path.clone().unwrap_or_else(|| PathBuf::from("."));
    if let Some(file) = &args.file {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let parsed = berth_build::parse_dockerfile(&text)
            .with_context(|| format!("parsing {}", file.display()))?;
        for warning in &parsed.warnings {
            eprintln!("warning: {warning}");
        }
        if args.path.is_none() {
            context = file
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf();
        }
        body.from_image = Some(parsed.from_image);
        body.start_cmd = parsed.start_cmd;
        body.ready_cmd = parsed.ready_cmd;
        body.steps = parsed
            .steps
            .into_iter()
            .map(|s| TemplateStep {
                kind: s.kind,
                args: s.args,
                files_hash: s.files_hash,
                force: s.force,
                force_upload: s.force_upload,
            })
            .collect();
    } else if let Some(image) = &args.from_image {
        body.from_image = Some(image.clone());
    } else {
        body.from_template = Some(
            args.from_template
                .clone()
                .unwrap_or_else(|| berth_template::BASE_TEMPLATE_ID.to_string()),
        );
    }
    if args.start_cmd.is_some() {
        body.start_cmd = args.start_cmd.clone();
    }
    if args.ready_cmd.is_some() {
        body.ready_cmd = args.ready_cmd.clone();
    }
    Ok(Plan { body, context })
}

async fn build(remote: &Remote, args: BuildArgs) -> Result<()> {
    let client = &remote.client;
    let mut plan = plan(&args)?;
    let requested = client
        .request_template_build(&TemplateBuildRequestV3 {
            name: Some(args.name.clone()),
            tags: (!args.tags.is_empty()).then(|| args.tags.clone()),
            cpu_count: args.cpu_count,
            memory_mb: args.memory_mb,
            ..TemplateBuildRequestV3::default()
        })
        .await
        .map_err(|err| remote.explain(err, "requesting the build"))?;
    let template_id = requested.template_id.clone();
    let build_id = requested.build_id.clone();
    eprintln!(
        "template {} ({template_id}), build {build_id}, tags {}",
        requested.names.join(","),
        requested.tags.join(",")
    );
    upload_copies(client, &template_id, &mut plan).await?;
    client
        .start_template_build(&template_id, &build_id, &plan.body)
        .await
        .map_err(|err| remote.explain(err, "starting the build"))?;
    let steps = plan.body.steps.clone();
    let follow = follow(client, &template_id, &build_id, &steps);
    tokio::select! {
        result = follow => result,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("cancelling build {build_id}");
            client.cancel_template_build(&template_id, &build_id).await
                .context("cancelling the build")?;
            bail!("build cancelled")
        }
    }
}

/// Packs and uploads every COPY step's source the server does not have, filling in
/// the steps' `filesHash`.
async fn upload_copies(client: &ApiClient, template_id: &str, plan: &mut Plan) -> Result<()> {
    let scratch = tempfile::tempdir().context("making a scratch directory")?;
    for (index, step) in plan.body.steps.iter_mut().enumerate() {
        let kind = step.kind.to_ascii_uppercase();
        if (kind != "COPY" && kind != "ADD") || step.files_hash.is_some() {
            continue;
        }
        let (Some(src), Some(dest)) = (step.args.first(), step.args.get(1)) else {
            bail!("step {}: COPY needs a source and a destination", index + 1);
        };
        let archive = scratch.path().join(format!("copy-{index}.tar.gz"));
        let (context, src_owned, dest_owned) = (plan.context.clone(), src.clone(), dest.clone());
        let archive_path = archive.clone();
        let hash = tokio::task::spawn_blocking(move || {
            berth_build::files::pack_copy_source(&context, &src_owned, &dest_owned, &archive_path)
        })
        .await
        .context("packing files")?
        .with_context(|| format!("packing COPY {src} (context {})", plan.context.display()))?;
        let link = client
            .template_file_upload_link(template_id, &hash)
            .await
            .with_context(|| format!("asking where to upload {src}"))?;
        match (link.present, link.url) {
            (true, _) => eprintln!("  {src}: already uploaded"),
            (false, Some(url)) => {
                client
                    .upload_template_files(&url, &archive)
                    .await
                    .with_context(|| format!("uploading {src}"))?;
                eprintln!("  {src}: uploaded");
            }
            (false, None) => bail!("the server gave no upload URL for {src}"),
        }
        step.files_hash = Some(hash);
    }
    Ok(())
}

/// Polls the build's status until it ends, showing a bar over its steps and its log.
async fn follow(
    client: &ApiClient,
    template_id: &str,
    build_id: &str,
    steps: &[TemplateStep],
) -> Result<()> {
    let bar = indicatif::ProgressBar::new(steps.len() as u64 + 2);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar.set_message("waiting for a build slot");
    let mut offset = 0usize;
    loop {
        let status = client
            .template_build_status(template_id, build_id, offset)
            .await
            .context("polling the build status")?;
        offset += status.log_entries.len();
        for entry in &status.log_entries {
            let step = entry.step.as_deref().unwrap_or("-");
            let line = format!("[{step:>8}] {}", entry.message);
            // Without a terminal the bar draws nothing: log lines go to stderr as is.
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
            let position = match step {
                "base" => 1,
                "finalize" => steps.len() as u64 + 2,
                number => number.parse::<u64>().map_or(bar.position(), |n| n + 1),
            };
            if position > bar.position() {
                bar.set_position(position);
            }
            bar.set_message(step_label(step, steps));
        }
        match status.status {
            TemplateBuildStatus::Ready if status.log_entries.is_empty() => {
                bar.finish_with_message("ready");
                eprintln!("template {template_id} build {build_id} is ready");
                return Ok(());
            }
            TemplateBuildStatus::Error if status.log_entries.is_empty() => {
                bar.abandon_with_message("failed");
                let reason = status.reason.map(|r| match r.step {
                    Some(step) => format!("step {step}: {}", r.message),
                    None => r.message,
                });
                bail!(
                    "build {build_id} failed: {}",
                    reason.unwrap_or_else(|| "no reason given".into())
                );
            }
            _ if !status.log_entries.is_empty() => {}
            _ => tokio::time::sleep(POLL_INTERVAL).await,
        }
    }
}

fn step_label(step: &str, steps: &[TemplateStep]) -> String {
    match step.parse::<usize>() {
        Ok(n) if n >= 1 && n <= steps.len() => {
            let s = &steps[n - 1];
            let args = s.args.first().cloned().unwrap_or_default();
            let short: String = args.chars().take(60).collect();
            format!("{} {short}", s.kind)
        }
        _ => step.to_string(),
    }
}
