//! Each role's scale target (`PDRole`): what its `/scale` asks for, read from the cache, and its
//! status written back (instances present, leader selector, the count run and who owns it).
//! The decisions are `pd_core::scaling`'s; this is their I/O.

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};

use pd_api::{PDRole, Role};
use pd_core::plan::ObservedPod;
use pd_core::scaling::{self, Asked, Scaled};

use super::cache::Owner;
use super::{Context, Error, FIELD_MANAGER};

/// What each role's `PDRole` asks for where another field manager than the operator owns its
/// `spec.replicas` (`scaling::ask_of`), from the cache.
pub(super) fn asked(ctx: &Context, owner: Owner<'_>) -> Asked {
    let name = owner.name;
    let Some(cache) = &ctx.stores.pd_roles else { return Asked::default() };
    let targets = cache.children(owner);
    let ask = |role: Role| {
        let wanted = pd_api::role_object_name(name, role);
        let target = targets.iter().find(|t| t.metadata.name.as_deref() == Some(wanted.as_str()))?;
        scaling::ask_of(target, FIELD_MANAGER)
    };
    Asked { prefill: ask(Role::Prefill), decode: ask(Role::Decode) }
}

/// Writes each `PDRole`'s status where it changed: the role's instances with pods in `observed`
/// (the routed KV set's), the leader selector, the count run and its owner. "Changed" is judged
/// against this process's own last write when the cache does not show it yet.
pub(super) async fn write_status(ctx: &Context, owner: Owner<'_>, scaled: &Scaled, observed: &[ObservedPod]) -> Result<(), Error> {
    let (ns, name) = (owner.ns, owner.name);
    let Some(cache) = &ctx.stores.pd_roles else { return Ok(()) };
    let targets = cache.children(owner);
    let api: Api<PDRole> = Api::namespaced(ctx.client.clone(), ns);
    for role in [Role::Prefill, Role::Decode] {
        let target_name = pd_api::role_object_name(name, role);
        let Some(target) = targets.iter().find(|t| t.metadata.name.as_deref() == Some(target_name.as_str())) else { continue };
        let present: std::collections::BTreeSet<u32> =
            observed.iter().filter(|p| p.role == role && !p.deleting).map(|p| p.instance).collect();
        let selector = pd_core::names::role_leader_selector(name, role).to_string();
        let next = scaling::role_status(scaled, role, u32::try_from(present.len()).unwrap_or(u32::MAX), selector);
        let key = format!("{ns}/{target_name}/{}", target.metadata.uid.as_deref().unwrap_or_default());
        if ctx.role_status_known(&key, target.status.as_ref()) == Some(next.clone()) {
            continue;
        }
        let body = serde_json::json!({"apiVersion": PDRole::api_version(&()), "kind": PDRole::kind(&()), "status": next});
        ctx.metrics.write("apply", "pdroles/status");
        match api.patch_status(&target_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await {
            // Deleted under us (its PDDeployment going): nothing to report.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
            Ok(_) => ctx.role_status_wrote(key, next),
        }
    }
    Ok(())
}
