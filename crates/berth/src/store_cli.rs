//! `berth volume …` and `berth secret …`: the team's volumes and secrets through the
//! REST API. A secret's value is read from stdin (never an argument, so it stays out
//! of shell history and process listings) and never printed: the API does not return
//! it.

use std::io::Read;

use anyhow::{bail, Context, Result};
use berth_api::{NewSecret, SecretUpdate};
use clap::Subcommand;

use crate::remote::{key_value, print_json, timestamp, Remote};

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// List the team's volumes.
    #[command(alias = "list")]
    Ls,
    /// Create a volume (names are unique per team) and print its id.
    Create { name: String },
    /// Show a volume, with the token of its content API.
    Info { volume_id: String },
    /// Delete a volume (refused while a sandbox mounts it).
    #[command(alias = "delete")]
    Rm { volume_id: String },
}

#[derive(Subcommand)]
pub enum SecretCommand {
    /// List the team's secrets (names and metadata; values are never returned).
    #[command(alias = "list")]
    Ls,
    /// Create a secret; its value is read from stdin.
    Create {
        name: String,
        /// Metadata pair (repeatable).
        #[arg(long = "metadata", value_parser = key_value)]
        metadata: Vec<(String, String)>,
    },
    /// Store a new version of a secret's value, read from stdin.
    Update {
        /// Name or id.
        secret: String,
    },
    /// Delete a secret.
    #[command(alias = "delete")]
    Rm {
        /// Name or id.
        secret: String,
    },
}

pub async fn volume(remote: &Remote, command: VolumeCommand) -> Result<()> {
    let client = &remote.client;
    match command {
        VolumeCommand::Ls => {
            let volumes = client
                .list_volumes()
                .await
                .map_err(|err| remote.explain(err, "listing volumes"))?;
            if remote.json {
                return print_json(&volumes);
            }
            println!("{:<36}  NAME", "ID");
            for volume in &volumes {
                println!("{:<36}  {}", volume.volume_id, volume.name);
            }
        }
        VolumeCommand::Create { name } => {
            let volume = client
                .create_volume(&name)
                .await
                .map_err(|err| remote.explain(err, &format!("creating volume {name}")))?;
            if remote.json {
                return print_json(&volume);
            }
            println!("{}", volume.volume_id);
        }
        VolumeCommand::Info { volume_id } => {
            let volume = client
                .get_volume(&volume_id)
                .await
                .map_err(|err| remote.explain(err, &format!("reading volume {volume_id}")))?;
            if remote.json {
                return print_json(&volume);
            }
            println!("id     {}\nname   {}", volume.volume_id, volume.name);
        }
        VolumeCommand::Rm { volume_id } => {
            client
                .delete_volume(&volume_id)
                .await
                .map_err(|err| remote.explain(err, &format!("deleting volume {volume_id}")))?;
            eprintln!("deleted volume {volume_id}");
        }
    }
    Ok(())
}

/// The secret value on stdin, without one trailing newline (what `echo` adds).
fn value_from_stdin() -> Result<String> {
    let mut value = String::new();
    std::io::stdin()
        .read_to_string(&mut value)
        .context("reading the secret's value from stdin")?;
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    if value.is_empty() {
        bail!(
            "no value on stdin: pipe it in, e.g. `printf %s \"$TOKEN\" | berth secret create NAME`"
        );
    }
    Ok(value)
}

pub async fn secret(remote: &Remote, command: SecretCommand) -> Result<()> {
    let client = &remote.client;
    match command {
        SecretCommand::Ls => {
            let mut secrets = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let page = client
                    .list_secrets(token.as_deref())
                    .await
                    .map_err(|err| remote.explain(err, "listing secrets"))?;
                secrets.extend(page.items);
                match page.next_token {
                    Some(next) => token = Some(next),
                    None => break,
                }
            }
            if remote.json {
                return print_json(&secrets);
            }
            println!(
                "{:<36}  {:<24}  {:>7}  {:<20}  METADATA",
                "ID", "NAME", "VERSION", "UPDATED"
            );
            for secret in &secrets {
                let metadata: Vec<String> = secret
                    .metadata
                    .iter()
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect();
                println!(
                    "{:<36}  {:<24}  {:>7}  {:<20}  {}",
                    secret.secret_id,
                    secret.name,
                    secret.current_version,
                    timestamp(secret.updated_at),
                    metadata.join(",")
                );
            }
        }
        SecretCommand::Create { name, metadata } => {
            let new_secret = NewSecret {
                name: name.clone(),
                value: value_from_stdin()?,
                metadata: (!metadata.is_empty()).then(|| metadata.into_iter().collect()),
            };
            let secret = client
                .create_secret(&new_secret)
                .await
                .map_err(|err| remote.explain(err, &format!("creating secret {name}")))?;
            if remote.json {
                return print_json(&secret);
            }
            println!("{}", secret.secret_id);
        }
        SecretCommand::Update { secret } => {
            let update = SecretUpdate {
                value: value_from_stdin()?,
                metadata: None,
            };
            let updated = client
                .update_secret(&secret, &update)
                .await
                .map_err(|err| remote.explain(err, &format!("updating secret {secret}")))?;
            if remote.json {
                return print_json(&updated);
            }
            eprintln!("{} is at version {}", updated.name, updated.current_version);
        }
        SecretCommand::Rm { secret } => {
            client
                .delete_secret(&secret)
                .await
                .map_err(|err| remote.explain(err, &format!("deleting secret {secret}")))?;
            eprintln!("deleted secret {secret}");
        }
    }
    Ok(())
}
