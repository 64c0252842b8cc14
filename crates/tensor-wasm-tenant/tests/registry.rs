//! Integration tests of the registry over a real `FsTenantStore`: durability
//! across reopen, token handling, bootstrap, and metrics lifecycle.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use proptest::prelude::*;
use tensor_wasm_tenant::{
    FsTenantStore, GpuIsolation, MemoryTenantStore, Principal, Quotas, QuotasPatch, Resource,
    TenantError, TenantMetrics, TenantRegistry, DEFAULT_TENANT_NAME, SECRET_LEN, SECRET_PREFIX,
};

fn open(dir: &Path) -> TenantRegistry {
    let store = FsTenantStore::open(dir).expect("open store");
    TenantRegistry::open(Arc::new(store), TenantMetrics::unregistered().unwrap())
        .expect("open registry")
}

fn open_with_metrics(dir: &Path, registry: &prometheus::Registry) -> TenantRegistry {
    let store = FsTenantStore::open(dir).expect("open store");
    TenantRegistry::open(Arc::new(store), TenantMetrics::register(registry).unwrap())
        .expect("open registry")
}

fn tenant_of(principal: Option<Principal>) -> Option<String> {
    match principal {
        Some(Principal::Tenant(t)) => Some(t.id().to_owned()),
        _ => None,
    }
}

/// Every file under `dir`, recursively, with its bytes.
fn all_files(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(all_files(&path));
        } else {
            let bytes = std::fs::read(&path).unwrap();
            out.push((path, bytes));
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The forms in which a secret must never appear in the store.
fn forbidden_forms(secret: &str) -> Vec<Vec<u8>> {
    let body = &secret[SECRET_PREFIX.len()..];
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body)
        .expect("secret body is base64url");
    assert_eq!(raw.len(), 32);
    let b64 = &base64::engine::general_purpose::STANDARD;
    vec![
        secret.as_bytes().to_vec(),
        body.as_bytes().to_vec(),
        raw.clone(),
        hex::encode(&raw).into_bytes(),
        hex::encode_upper(&raw).into_bytes(),
        b64.encode(&raw).into_bytes(),
        b64.encode(secret).into_bytes(),
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(secret)
            .into_bytes(),
        hex::encode(secret).into_bytes(),
    ]
}

#[test]
fn tenants_survive_reopen_with_creates_updates_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, token_a);
    {
        let r = open(dir.path());
        let quotas = Quotas {
            max_functions: 3,
            ..Quotas::default()
        };
        let (info, token) = r
            .create_tenant("alpha", quotas, GpuIsolation::OwnContext)
            .unwrap();
        a = info;
        token_a = token;
        b = r
            .create_tenant("beta", Quotas::default(), GpuIsolation::default())
            .unwrap()
            .0;
        let c = r
            .create_tenant("gamma", Quotas::default(), GpuIsolation::default())
            .unwrap()
            .0;
        let patch = QuotasPatch {
            max_live_instances: Some(7),
            requests_per_second: Some(0),
            ..QuotasPatch::default()
        };
        let updated = r.update(&b.id, &patch, Some("beta2")).unwrap();
        assert_eq!(updated.name, "beta2");
        assert_eq!(updated.quotas.max_live_instances, 7);
        assert_eq!(r.lookup(&b.id).unwrap().name(), "beta2");
        assert_eq!(r.lookup(&b.id).unwrap().limit(Resource::LiveInstances), 7);
        assert!(r.delete(&c.id).unwrap());
        assert!(!r.delete(&c.id).unwrap());
        assert_eq!(r.len(), 2);
    }

    let r = open(dir.path());
    let list = r.list();
    // "Oldest first" is to the millisecond: both may share one, so compare sorted.
    let mut names: Vec<_> = list.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["alpha", "beta2"]);
    let alpha = r.info(&a.id).unwrap();
    assert_eq!(alpha, a);
    assert_eq!(alpha.quotas.max_functions, 3);
    assert_eq!(alpha.gpu_isolation, GpuIsolation::OwnContext);
    let beta = r.info(&b.id).unwrap();
    assert_eq!(beta.quotas.max_live_instances, 7);
    assert_eq!(beta.quotas.requests_per_second, 0);
    assert_eq!(beta.quotas.max_functions, 100);
    let live = r.lookup(&b.id).unwrap();
    assert_eq!(live.quotas(), beta.quotas);
    assert_eq!(live.name(), "beta2");
    assert_eq!(
        tenant_of(r.authenticate(&token_a.secret)),
        Some(a.id.clone())
    );
}

#[test]
fn secrets_are_shown_once_and_stored_only_as_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let mut secrets = Vec::new();
    {
        let r = open(dir.path());
        let boot = r.bootstrap().unwrap().unwrap();
        secrets.push(boot.admin_token.clone());
        secrets.push(boot.tenant_token.clone());
        let (info, token) = r
            .create_tenant("acme", Quotas::default(), GpuIsolation::default())
            .unwrap();
        secrets.push(token.secret.clone());
        let second = r.create_token(&info.id, "ci").unwrap();
        secrets.push(second.secret.clone());
        r.revoke_token(&info.id, &second.info.id).unwrap();
        // Nothing that describes a tenant carries a secret.
        let listing = serde_json::to_string(&r.list()).unwrap();
        for secret in &secrets {
            assert!(!listing.contains(secret.as_str()));
        }
    }
    for secret in &secrets {
        assert!(secret.starts_with(SECRET_PREFIX));
        assert_eq!(secret.len(), SECRET_LEN);
    }
    let files = all_files(dir.path());
    assert!(files.len() >= 3, "admin and two tenant records: {files:?}");
    for (path, bytes) in &files {
        for secret in &secrets {
            for form in forbidden_forms(secret) {
                assert!(
                    !contains(bytes, &form),
                    "{} holds a form of a secret",
                    path.display()
                );
            }
        }
    }
    // What is stored is the hash.
    let stored: Vec<u8> = files.iter().flat_map(|(_, b)| b.clone()).collect();
    for secret in &secrets {
        use sha2::Digest as _;
        let hash = hex::encode(sha2::Sha256::digest(secret.as_bytes()));
        assert!(contains(&stored, hash.as_bytes()));
    }
}

#[test]
fn tokens_authenticate_until_revoked_and_several_per_tenant_work() {
    let dir = tempfile::tempdir().unwrap();
    let r = open(dir.path());
    let (info, first) = r
        .create_tenant("acme", Quotas::default(), GpuIsolation::default())
        .unwrap();
    let second = r.create_token(&info.id, "deploy").unwrap();
    let third = r.create_token(&info.id, "ci").unwrap();
    assert_ne!(second.info.id, third.info.id);
    for t in [&first, &second, &third] {
        assert_eq!(tenant_of(r.authenticate(&t.secret)), Some(info.id.clone()));
    }
    assert_eq!(r.info(&info.id).unwrap().tokens.len(), 3);

    assert!(r.revoke_token(&info.id, &second.info.id).unwrap());
    assert!(r.authenticate(&second.secret).is_none());
    assert!(r.revoke_token(&info.id, &second.info.id).unwrap());
    assert!(!r.revoke_token(&info.id, "tk-ffffffffffff").unwrap());
    assert_eq!(
        tenant_of(r.authenticate(&first.secret)),
        Some(info.id.clone())
    );
    assert_eq!(
        tenant_of(r.authenticate(&third.secret)),
        Some(info.id.clone())
    );
    let tokens = r.info(&info.id).unwrap().tokens;
    let revoked: Vec<_> = tokens.iter().filter(|t| t.revoked).map(|t| &t.id).collect();
    assert_eq!(revoked, [&second.info.id]);
    assert_eq!(tokens[2].label, "ci");

    // Revocation is durable.
    drop(r);
    let r = open(dir.path());
    assert!(r.authenticate(&second.secret).is_none());
    assert_eq!(
        tenant_of(r.authenticate(&first.secret)),
        Some(info.id.clone())
    );

    // Tokens of one tenant never resolve to another; deleting a tenant kills its tokens.
    let (other, other_token) = r
        .create_tenant("other", Quotas::default(), GpuIsolation::default())
        .unwrap();
    assert_eq!(
        tenant_of(r.authenticate(&other_token.secret)),
        Some(other.id.clone())
    );
    let held = r.lookup(&info.id).unwrap();
    assert!(r.delete(&info.id).unwrap());
    assert!(held.is_deleted());
    assert!(r.authenticate(&first.secret).is_none());
    assert!(r.authenticate(&third.secret).is_none());
    assert!(r.lookup(&info.id).is_none());
    assert!(matches!(
        r.create_token(&info.id, "late"),
        Err(TenantError::NotFound(_))
    ));
}

#[test]
fn admin_token_is_admin_and_tenant_tokens_never_are() {
    let dir = tempfile::tempdir().unwrap();
    let r = open(dir.path());
    let boot = r.bootstrap().unwrap().unwrap();
    assert!(matches!(
        r.authenticate(&boot.admin_token),
        Some(Principal::Admin)
    ));
    let default = tenant_of(r.authenticate(&boot.tenant_token)).unwrap();
    assert_eq!(default, boot.tenant.id);
    let (info, token) = r
        .create_tenant("acme", Quotas::default(), GpuIsolation::default())
        .unwrap();
    let extra = r.create_token(&info.id, "x").unwrap();
    for secret in [&boot.tenant_token, &token.secret, &extra.secret] {
        assert!(!matches!(r.authenticate(secret), Some(Principal::Admin)));
        assert!(r.authenticate(secret).is_some());
    }
    drop(r);
    let r = open(dir.path());
    assert!(matches!(
        r.authenticate(&boot.admin_token),
        Some(Principal::Admin)
    ));
    assert!(!matches!(
        r.authenticate(&boot.tenant_token),
        Some(Principal::Admin)
    ));
    // Near misses are refused.
    let mut altered = boot.admin_token.clone();
    let last = altered.pop().unwrap();
    altered.push(if last == 'A' { 'B' } else { 'A' });
    assert!(r.authenticate(&altered).is_none());
    assert!(r
        .authenticate(&boot.admin_token[..SECRET_LEN - 1])
        .is_none());
    assert!(r.authenticate(&format!("{} ", boot.admin_token)).is_none());
    assert!(r.authenticate("").is_none());
}

#[test]
fn bootstrap_happens_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let r = open(dir.path());
    let boot = r.bootstrap().unwrap().expect("first bootstrap");
    assert_eq!(boot.tenant.name, DEFAULT_TENANT_NAME);
    assert_eq!(boot.tenant.tokens.len(), 1);
    assert_eq!(boot.tenant.quotas, Quotas::default());
    assert_ne!(boot.admin_token, boot.tenant_token);
    assert!(r.bootstrap().unwrap().is_none());
    drop(r);
    let r = open(dir.path());
    assert!(r.bootstrap().unwrap().is_none());
    assert_eq!(r.list().len(), 1);
}

#[test]
fn bootstrap_after_a_crash_reuses_the_default_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let first = {
        let r = open(dir.path());
        r.bootstrap().unwrap().unwrap()
    };
    // Simulate a crash between the tenant and the admin write.
    std::fs::remove_file(dir.path().join("admin.json")).unwrap();
    let r = open(dir.path());
    assert!(r.authenticate(&first.admin_token).is_none());
    let second = r
        .bootstrap()
        .unwrap()
        .expect("admin missing, so bootstrap again");
    assert_eq!(second.tenant.id, first.tenant.id);
    assert_eq!(second.tenant.tokens.len(), 2);
    assert_eq!(r.list().len(), 1);
    assert!(matches!(
        r.authenticate(&second.admin_token),
        Some(Principal::Admin)
    ));
    assert_eq!(
        tenant_of(r.authenticate(&second.tenant_token)),
        Some(first.tenant.id.clone())
    );
}

#[test]
fn concurrent_bootstraps_produce_one_admin() {
    let r = Arc::new(
        TenantRegistry::open(
            Arc::new(MemoryTenantStore::new()),
            TenantMetrics::unregistered().unwrap(),
        )
        .unwrap(),
    );
    let results: Vec<bool> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let r = Arc::clone(&r);
                s.spawn(move || r.bootstrap().unwrap().is_some())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|b| **b).count(), 1);
    assert_eq!(r.list().len(), 1);
}

#[test]
fn metrics_series_follow_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let prom = prometheus::Registry::new();
    let r = open_with_metrics(dir.path(), &prom);
    let quotas = Quotas {
        max_live_instances: 1,
        ..Quotas::default()
    };
    let (info, _) = r
        .create_tenant("acme", quotas, GpuIsolation::default())
        .unwrap();
    let tenant = r.lookup(&info.id).unwrap();
    let held = tenant.acquire(Resource::LiveInstances, 1).unwrap();
    let _running = tenant.acquire(Resource::ConcurrentInvocations, 1).unwrap();
    assert!(tenant.acquire(Resource::LiveInstances, 1).is_err());
    assert_eq!(r.metrics().denied(&info.id, "max_live_instances"), 1);
    let text = render(&prom);
    assert!(text.contains(&format!(
        "tensor_wasm_tenant_live_instances{{tenant=\"{}\"}} 1",
        info.id
    )));
    assert!(text.contains(&format!(
        "tensor_wasm_tenant_concurrent_invocations{{tenant=\"{}\"}} 1",
        info.id
    )));
    drop(held);
    assert!(render(&prom).contains(&format!(
        "tensor_wasm_tenant_live_instances{{tenant=\"{}\"}} 0",
        info.id
    )));
    r.delete(&info.id).unwrap();
    assert!(!render(&prom).contains(&info.id));
}

fn render(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder as _;
    let mut buf = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .unwrap();
    String::from_utf8(buf).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bearers_never_panic_or_authenticate(
        bearer in prop_oneof![
            any::<String>(),
            "twt_[A-Za-z0-9_-]{43}",
            "twt_[A-Za-z0-9_-]{0,60}",
            "[ -~]{0,80}",
        ]
    ) {
        let r = registry_with_tokens();
        prop_assert!(r.authenticate(&bearer).is_none());
    }
}

/// One registry shared by the property test: bootstrapped, with a tenant
/// that holds a revoked and a live token.
fn registry_with_tokens() -> &'static TenantRegistry {
    static REGISTRY: std::sync::OnceLock<TenantRegistry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = TenantRegistry::open(
            Arc::new(MemoryTenantStore::new()),
            TenantMetrics::unregistered().unwrap(),
        )
        .unwrap();
        r.bootstrap().unwrap().unwrap();
        let (info, _) = r
            .create_tenant("acme", Quotas::default(), GpuIsolation::default())
            .unwrap();
        let revoked = r.create_token(&info.id, "old").unwrap();
        r.revoke_token(&info.id, &revoked.info.id).unwrap();
        r
    })
}

#[test]
fn a_second_registry_over_the_same_store_follows_reloads() {
    // Two registries over one store stand for two replicas over a shared store: what one
    // changes, the other picks up with `reload_tenant` / `reload_admin`.
    let store = Arc::new(MemoryTenantStore::new());
    let metrics = || TenantMetrics::unregistered().unwrap();
    let a = TenantRegistry::open(store.clone(), metrics()).unwrap();
    let b = TenantRegistry::open(store.clone(), metrics()).unwrap();
    let boot = a.bootstrap().unwrap().expect("first bootstrap");
    assert!(
        b.authenticate(&boot.admin_token).is_none(),
        "not reloaded yet"
    );
    b.reload_admin().unwrap();
    assert!(matches!(
        b.authenticate(&boot.admin_token),
        Some(Principal::Admin)
    ));

    let (info, token) = a
        .create_tenant("acme", Quotas::default(), GpuIsolation::default())
        .unwrap();
    b.reload_tenant(&info.id).unwrap();
    assert_eq!(
        tenant_of(b.authenticate(&token.secret)),
        Some(info.id.clone())
    );
    let patch = QuotasPatch {
        max_functions: Some(3),
        ..QuotasPatch::default()
    };
    a.update(&info.id, &patch, Some("acme-2")).unwrap();
    a.set_raw_ptx(&info.id, true).unwrap();
    b.reload_tenant(&info.id).unwrap();
    let live = b.lookup(&info.id).unwrap();
    assert_eq!(live.limit(Resource::Functions), 3);
    assert_eq!(live.name(), "acme-2");
    assert!(live.raw_ptx());

    // A revoked token stops authenticating on B after the reload; a new one starts.
    a.revoke_token(&info.id, &token.info.id).unwrap();
    let second = a.create_token(&info.id, "second").unwrap();
    b.reload_tenant(&info.id).unwrap();
    assert!(b.authenticate(&token.secret).is_none());
    assert_eq!(
        tenant_of(b.authenticate(&second.secret)),
        Some(info.id.clone())
    );

    // Deleted on A: gone on B, its token refused, holders see the deletion.
    assert!(a.delete(&info.id).unwrap());
    b.reload_tenant(&info.id).unwrap();
    assert!(b.lookup(&info.id).is_none());
    assert!(b.authenticate(&second.secret).is_none());
    assert!(live.is_deleted());
}
