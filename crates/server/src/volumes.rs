//! The volume service: team volumes (a row, and the runtime's storage), resolving a
//! create's `volumeMounts` to volumes of the caller's team, and refusing to delete a
//! volume a live sandbox mounts.
//!
//! Deleting races with mounting: a create resolves names, then the runtime mounts, then
//! the row that records the mount is written. So every bring-up that mounts volumes holds
//! `AppState::volume_mounting` for reading from before the runtime call until its row is
//! written, and a delete holds it for writing while it checks the rows and removes the
//! volume: a delete never removes a volume a sandbox is about to mount.

use berth_api::{ApiError, SandboxVolumeMount};
use berth_runtime::VolumeMount;
use berth_store::{SandboxRecord, StoreError, VolumeMountRecord, VolumeRecord};

use crate::error::ServiceError;
use crate::AppState;

/// Longest volume name accepted.
const MAX_NAME_LEN: usize = 128;

/// Checks a volume name: `^[a-zA-Z0-9_-]+$`, at most 128 characters.
pub fn validate_name(name: &str) -> Result<(), ApiError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "volume name {name:?} is invalid: use 1-{MAX_NAME_LEN} letters, digits, '_' or '-'"
        )))
    }
}

/// Runs blocking runtime work on volume `volume` off the async threads.
async fn blocking<T: Send + 'static>(
    volume: &str,
    work: impl FnOnce() -> Result<T, berth_runtime::RuntimeError> + Send + 'static,
) -> Result<T, ServiceError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|source| ServiceError::Task {
            what: "volume call",
            source,
        })?
        .map_err(|source| ServiceError::Volume {
            volume: volume.to_string(),
            source,
        })
}

/// Creates volume `name` of `team_id`: the row first (the name is claimed), then the
/// runtime's storage; the row goes again if the storage cannot be made.
pub async fn create(
    state: &AppState,
    team_id: &str,
    name: &str,
) -> Result<VolumeRecord, ServiceError> {
    let record = state.store.insert_volume(team_id, name)?;
    crate::cluster::node::place_here(state, berth_store::PlacedKind::Volume, &record.id)?;
    let runtime = state.runtime.clone();
    let id = record.id.clone();
    if let Err(err) = blocking(&record.id, move || runtime.create_volume(&id)).await {
        if let Err(undo) = state.store.delete_volume(team_id, &record.id) {
            tracing::error!(volume = %record.id, %undo, "removing the row of a volume whose storage failed");
        }
        return Err(err);
    }
    Ok(record)
}

/// Deletes volume `id` of `team_id` and its data; 409 naming the sandboxes while a
/// running or paused sandbox mounts it.
pub async fn delete(state: &AppState, team_id: &str, id: &str) -> Result<(), ServiceError> {
    let _no_mounts_starting = state.volume_mounting.write().await;
    let record = state
        .store
        .delete_volume(team_id, id)
        .map_err(|err| match err {
            StoreError::InUse { users, .. } => ServiceError::VolumeInUse {
                volume: id.to_string(),
                sandboxes: users,
            },
            other => other.into(),
        })?;
    let runtime = state.runtime.clone();
    let owned = record.id.clone();
    match blocking(&record.id, move || runtime.delete_volume(&owned)).await {
        Err(ServiceError::Volume {
            source: berth_runtime::RuntimeError::VolumeNotFound(_),
            ..
        }) => Ok(()),
        other => other,
    }
}

/// The mounts a create asks for, as volumes of `team_id`: paths validated together
/// (absolute, not system paths, no duplicates or nesting), names resolved.
pub fn resolve_mounts(
    state: &AppState,
    team_id: &str,
    requested: &[SandboxVolumeMount],
) -> Result<Vec<VolumeMountRecord>, crate::error::HttpError> {
    berth_runtime::validate_mount_paths(requested.iter().map(|m| m.path.as_str())).map_err(
        |(i, reason)| {
            ApiError::BadRequest(format!(
                "volumeMounts[{i}].path {:?} {reason}",
                requested[i].path
            ))
        },
    )?;
    let mut mounts = Vec::with_capacity(requested.len());
    for (i, mount) in requested.iter().enumerate() {
        let volume = state
            .store
            .volume_by_name(team_id, &mount.name)?
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "volumeMounts[{i}].name: volume {:?} doesn't exist or you don't have access to it",
                    mount.name
                ))
            })?;
        mounts.push(VolumeMountRecord {
            volume_id: volume.id,
            name: volume.name,
            path: mount.path.trim_end_matches('/').to_string(),
        });
    }
    Ok(mounts)
}

/// The runtime's view of recorded mounts.
pub fn runtime_mounts(mounts: &[VolumeMountRecord]) -> Vec<VolumeMount> {
    mounts
        .iter()
        .map(|m| VolumeMount {
            volume: m.volume_id.clone(),
            path: m.path.clone().into(),
        })
        .collect()
}

/// A sandbox's mounts as the API reports them.
pub fn api_mounts(record: &SandboxRecord) -> Vec<SandboxVolumeMount> {
    record
        .volume_mounts
        .iter()
        .map(|m| SandboxVolumeMount {
            name: m.name.clone(),
            path: m.path.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_names_follow_the_spec_pattern() {
        assert!(validate_name("my-data_1").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name("é").is_err());
        assert!(validate_name(&"x".repeat(129)).is_err());
    }
}
