//! Prometheus metrics per tenant, labelled by tenant id only so that the
//! number of series stays bounded by the number of tenants.

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::quota::{Resource, RATE_QUOTA_NAME};

/// Number of quota label values: one per resource, and the rate.
pub(crate) const QUOTA_LABELS: usize = Resource::ALL.len() + 1;

/// Index of the rate quota in [`TenantSeries::denied`].
pub(crate) const RATE_INDEX: usize = Resource::ALL.len();

/// Handles to the tenant metric families.
///
/// - `tensor_wasm_tenant_quota_denied_total{tenant, quota}`: requests refused
///   by a quota (`quota` is a field name of [`Quotas`](crate::Quotas)).
/// - `tensor_wasm_tenant_live_instances{tenant}`: live instances held.
/// - `tensor_wasm_tenant_concurrent_invocations{tenant}`: invocations running.
///
/// A tenant's series are created when it is loaded or created and removed
/// when it is deleted.
#[derive(Clone, Debug)]
pub struct TenantMetrics {
    denied: IntCounterVec,
    live_instances: IntGaugeVec,
    concurrent_invocations: IntGaugeVec,
    guest_memory_bytes: IntGaugeVec,
}

/// The series of one tenant, resolved once.
#[derive(Clone, Debug)]
pub(crate) struct TenantSeries {
    /// Indexed by `Resource as usize`, then [`RATE_INDEX`].
    pub(crate) denied: [IntCounter; QUOTA_LABELS],
    pub(crate) live_instances: IntGauge,
    pub(crate) concurrent_invocations: IntGauge,
    pub(crate) guest_memory_bytes: IntGauge,
}

fn quota_label(index: usize) -> &'static str {
    Resource::ALL
        .get(index)
        .map_or(RATE_QUOTA_NAME, |r| r.quota_name())
}

impl TenantMetrics {
    /// Creates the metric families and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = TenantMetrics::unregistered()?;
        registry.register(Box::new(metrics.denied.clone()))?;
        registry.register(Box::new(metrics.live_instances.clone()))?;
        registry.register(Box::new(metrics.concurrent_invocations.clone()))?;
        registry.register(Box::new(metrics.guest_memory_bytes.clone()))?;
        Ok(metrics)
    }

    /// Creates the metric families without registering them anywhere.
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(TenantMetrics {
            denied: IntCounterVec::new(
                Opts::new(
                    "tensor_wasm_tenant_quota_denied_total",
                    "Requests refused by a tenant quota, by tenant id and quota.",
                ),
                &["tenant", "quota"],
            )?,
            live_instances: IntGaugeVec::new(
                Opts::new(
                    "tensor_wasm_tenant_live_instances",
                    "Live instances held by a tenant.",
                ),
                &["tenant"],
            )?,
            concurrent_invocations: IntGaugeVec::new(
                Opts::new(
                    "tensor_wasm_tenant_concurrent_invocations",
                    "Invocations of a tenant running now.",
                ),
                &["tenant"],
            )?,
            guest_memory_bytes: IntGaugeVec::new(
                Opts::new(
                    "tensor_wasm_tenant_guest_memory_bytes",
                    "Guest memory held by a tenant's running invocations (its max_guest_memory_bytes quota), in bytes.",
                ),
                &["tenant"],
            )?,
        })
    }

    /// Refusals of `quota` for `tenant_id` so far; 0 when there is no such
    /// series (reading never creates one).
    pub fn denied(&self, tenant_id: &str, quota: &str) -> u64 {
        let families = self.denied.collect();
        let matches = |m: &prometheus::proto::Metric| {
            let labels = m.get_label();
            let has = |name: &str, value: &str| {
                labels
                    .iter()
                    .any(|l| l.name() == name && l.value() == value)
            };
            has("tenant", tensor_wasm_telemetry::labels::tenant(tenant_id)) && has("quota", quota)
        };
        families
            .iter()
            .flat_map(|f| f.get_metric())
            .find(|m| matches(m))
            .map_or(0, |m| m.get_counter().get_value() as u64)
    }

    pub(crate) fn series(&self, tenant_id: &str) -> TenantSeries {
        // Past the label limit, tenants share the `other` series (the gauges then sum them).
        let tenant_id = tensor_wasm_telemetry::labels::tenant(tenant_id);
        TenantSeries {
            denied: std::array::from_fn(|i| {
                self.denied.with_label_values(&[tenant_id, quota_label(i)])
            }),
            live_instances: self.live_instances.with_label_values(&[tenant_id]),
            concurrent_invocations: self.concurrent_invocations.with_label_values(&[tenant_id]),
            guest_memory_bytes: self.guest_memory_bytes.with_label_values(&[tenant_id]),
        }
    }

    /// Drops every series of `tenant_id` from the families.
    pub(crate) fn remove(&self, tenant_id: &str) {
        if tensor_wasm_telemetry::labels::tenant(tenant_id) != tenant_id {
            // Shared with other tenants: it stays.
            return;
        }
        for i in 0..QUOTA_LABELS {
            let _ = self
                .denied
                .remove_label_values(&[tenant_id, quota_label(i)]);
        }
        let _ = self.live_instances.remove_label_values(&[tenant_id]);
        let _ = self
            .concurrent_invocations
            .remove_label_values(&[tenant_id]);
        let _ = self.guest_memory_bytes.remove_label_values(&[tenant_id]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series_count(registry: &Registry) -> usize {
        registry
            .gather()
            .iter()
            .map(|family| family.get_metric().len())
            .sum()
    }

    #[test]
    fn series_appear_per_tenant_and_go_away_on_remove() {
        let registry = Registry::new();
        let metrics = TenantMetrics::register(&registry).unwrap();
        let series = metrics.series("tn-0000000000000001");
        assert_eq!(series_count(&registry), QUOTA_LABELS + 3);
        series.denied[RATE_INDEX].inc();
        assert_eq!(metrics.denied("tn-0000000000000009", "max_functions"), 0);
        assert_eq!(series_count(&registry), QUOTA_LABELS + 3);
        assert_eq!(
            metrics.denied("tn-0000000000000001", "requests_per_second"),
            1
        );
        metrics.series("tn-0000000000000002");
        assert_eq!(series_count(&registry), 2 * (QUOTA_LABELS + 3));
        metrics.remove("tn-0000000000000001");
        assert_eq!(series_count(&registry), QUOTA_LABELS + 3);
    }

    #[test]
    fn quota_labels_are_distinct_field_names() {
        let labels: std::collections::HashSet<_> = (0..QUOTA_LABELS).map(quota_label).collect();
        assert_eq!(labels.len(), QUOTA_LABELS);
        assert_eq!(quota_label(RATE_INDEX), "requests_per_second");
    }
}
