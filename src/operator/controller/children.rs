//! The controller's side of `pd_core::child_kinds!`: a cache and a watch per kind, their
//! readiness and divergence checks, and the applier's stages, all generated from the one list.
//! Engine pods are here too (cached and watched), but the planner applies them.

use std::collections::BTreeSet;

use futures::future::BoxFuture;
use futures::{FutureExt, TryFutureExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Controller;
use kube::runtime::watcher;

use pd_api::PDDeployment;
use pd_core::render::Rendered;

use super::cache::{Cache, cached};
use super::slim::slim_pod;
use super::watches::{managed_selector, pod_deployment, scoped};
use super::{Context, Error, watchdog};

/// A controller of PDDeployments.
pub type PddController = Controller<DeserializeGuard<PDDeployment>>;

/// One check of `watchdog`: a kind's resource name and what diverged.
type Check<'a> = BoxFuture<'a, Result<(&'static str, watchdog::Divergence), kube::Error>>;

macro_rules! child_stores {
    (before_pods: [$($(#[$b:meta])* $bf:ident: $bt:ty { $($bx:tt)* }),* $(,)?],
     after_pods: [$($(#[$a:meta])* $af:ident: $at:ty { $($ax:tt)* }),* $(,)?] $(,)?) => {
        child_stores!(@all $($bf: $bt { $($bx)* },)* $($af: $at { $($ax)* },)*);
    };
    (@all $($f:ident: $t:ty { stage: $stage:literal, per_set: $per_set:literal, gated: $gated:literal, slim: $slim:path },)*) => {
        /// Reflector caches of every child kind the operator owns (label `managed-by=pd-operator`):
        /// the engine pods, and each kind of `pd_core::child_kinds!`, `None` where the kind is gated
        /// on an API the cluster does not serve.
        #[derive(Clone)]
        pub struct ChildStores {
            pub pods: Cache<Pod>,
            $(pub $f: Option<Cache<$t>>,)*
        }

        impl ChildStores {
            /// Caches and watches every child kind, and has `controller` reconcile the owner of
            /// each changed child (a pod, by its deployment label).
            pub fn watch(client: &Client, ns: Option<&str>, gang_api: bool, controller: PddController) -> (Self, PddController) {
                let managed = watcher::Config::default().labels(&managed_selector());
                let (pods, events) = cached(scoped(client, ns), managed.clone(), slim_pod);
                let controller = controller.watches_stream(events, pod_deployment);
                $(let ($f, controller) = if !$gated || gang_api {
                    let (cache, events) = cached(scoped::<$t>(client, ns), managed.clone(), |o: &mut $t| {
                        $slim(o);
                        super::slim::Slim::slim(o);
                    });
                    (Some(cache), controller.owns_stream(events))
                } else {
                    (None, controller)
                };)*
                (Self { pods, $($f,)* }, controller)
            }

            /// Waits for every cache's first full list (instant once they have it), at most
            /// `CACHE_READY_BOUND`: then the kinds still waiting are the error.
            pub async fn ready(&self) -> Result<(), Error> {
                let all = async {
                    self.pods.wait_until_ready().await.map_err(|_| Error::CacheClosed)?;
                    $(if let Some(cache) = &self.$f {
                        cache.wait_until_ready().await.map_err(|_| Error::CacheClosed)?;
                    })*
                    Ok(())
                };
                match tokio::time::timeout(super::CACHE_READY_BOUND, all).await {
                    Ok(r) => r,
                    Err(_) => Err(Error::CacheNotReady(self.not_ready().join(", "))),
                }
            }

            /// The kinds whose cache has not had its first full list yet.
            pub fn not_ready(&self) -> Vec<&'static str> {
                use futures::FutureExt;
                let mut waiting = Vec::new();
                if self.pods.wait_until_ready().now_or_never().is_none() {
                    waiting.push("pods");
                }
                $(if self.$f.as_ref().is_some_and(|c| c.wait_until_ready().now_or_never().is_none()) {
                    waiting.push(<$t as k8s_openapi::Resource>::URL_PATH_SEGMENT);
                })*
                waiting
            }

            /// The watchdog's check of every child cache against a metadata list of the same scope
            /// and `selector`, by kind (see `watchdog`).
            pub async fn divergence(&self, client: &Client, ns: Option<&str>, selector: &str)
                -> Result<Vec<(&'static str, watchdog::Divergence)>, kube::Error> {
                let sel = Some(selector);
                let mut checks: Vec<Check<'_>> = vec![watchdog::check(scoped(client, ns), sel, &self.pods).map_ok(|d| ("pods", d)).boxed()];
                $(if let Some(cache) = &self.$f {
                    let plural = <$t as k8s_openapi::Resource>::URL_PATH_SEGMENT;
                    checks.push(watchdog::check(scoped(client, ns), sel, cache).map_ok(move |d| (plural, d)).boxed());
                })*
                futures::future::try_join_all(checks).await
            }

            /// Applies `rendered`'s objects of every kind stage by stage, the kinds of a stage at
            /// once; a kind kept per KV set keeps the objects of the sets in `live`.
            pub async fn sync(&self, ctx: &Context, owner: super::cache::Owner<'_>, rendered: &Rendered, live: &BTreeSet<String>) -> Result<(), Error> {
                let none = BTreeSet::new();
                for stage in 0..=pd_core::children::LAST_STAGE {
                    let mut work: Vec<BoxFuture<'_, Result<(), Error>>> = Vec::new();
                    $(if let (true, Some(cache)) = ($stage == stage, &self.$f) {
                        let keep = if $per_set { live } else { &none };
                        work.push(ctx.sync_children(cache, owner, &rendered.$f, keep).boxed());
                    })*
                    futures::future::try_join_all(work).await?;
                }
                Ok(())
            }

            /// Stores filled by `source`, every kind served (tests).
            #[cfg(test)]
            pub fn from_source(source: &impl CacheSource) -> Self {
                Self { pods: source.cache(), $($f: Some(source.cache()),)* }
            }
        }
    };
}
pd_core::child_kinds!(child_stores);

/// Where a test's caches come from: one ready cache of any kind.
#[cfg(test)]
pub trait CacheSource {
    fn cache<K>(&self) -> Cache<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static;
}
