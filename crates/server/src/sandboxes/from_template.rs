//! How a new sandbox of a template boots: on the template's layers with its build's
//! resources, or — when the build had a start command — restored from the build's
//! memory checkpoint, so the start command is already serving (the pipeline then
//! `/init`s envd with the new identity, as for a snapshot start, and the create's
//! network policy replaces the build sandbox's).

use berth_runtime::SandboxSpec;

use super::pipeline::Boot;
use super::CreateRequest;
use crate::error::ServiceError;
use crate::templates::SandboxTemplate;

/// The boot of new sandbox `id` of `template`, as `request` asks.
pub(super) fn boot(
    id: &str,
    template: &SandboxTemplate,
    request: &CreateRequest,
) -> Result<Boot, ServiceError> {
    match &template.manifest.checkpoint {
        Some(checkpoint_id) => {
            // Volumes are mounted when a sandbox's root is built; a restored start
            // command runs in a root that was built without them.
            if !request.volume_mounts.is_empty() {
                return Err(ServiceError::StartCommandVolumes(template.alias.clone()));
            }
            Ok(Boot::Restore {
                checkpoint_id: checkpoint_id.clone(),
                memory: true,
                network: request.network.clone(),
            })
        }
        None => Ok(Boot::Fresh {
            spec: SandboxSpec {
                id: id.to_string(),
                template: template.manifest.id.clone(),
                layers: template.manifest.layers.clone(),
                cpu_count: template.resources.cpu_count,
                memory_mb: template.resources.memory_mb,
                disk_size_mb: template.resources.disk_size_mb,
                volumes: crate::volumes::runtime_mounts(&request.volume_mounts),
            },
            network: request.network.clone(),
        }),
    }
}

/// The sandbox log line of a create from `template`.
pub(super) fn log_line(template: &SandboxTemplate) -> String {
    match &template.manifest.checkpoint {
        Some(_) => format!(
            "sandbox created from template {} (build {}), its start command running from the build's checkpoint",
            template.alias, template.build_id
        ),
        None => format!(
            "sandbox created from template {} (build {})",
            template.alias, template.build_id
        ),
    }
}
