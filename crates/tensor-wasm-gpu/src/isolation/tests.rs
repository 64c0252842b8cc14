//! Unit tests of `isolation`: the per-tenant lane maps (creation, eviction, both kinds at
//! once), `GpuIsolation` parsing, and `TenantKey` levels and comparison.

use std::sync::atomic::AtomicUsize;
use std::sync::Barrier;

use super::*;

/// A lane stand-in: which creation made it.
type Lane = Arc<usize>;

fn counter() -> (
    Arc<AtomicUsize>,
    impl Fn() -> Result<Lane, GpuError> + Clone,
) {
    let made = Arc::new(AtomicUsize::new(0));
    let make = {
        let made = made.clone();
        move || Ok(Arc::new(made.fetch_add(1, Ordering::SeqCst)))
    };
    (made, make)
}

fn key(id: &str) -> TenantKey {
    TenantKey::new(id)
}

#[test]
fn lanes_are_created_lazily_once_per_tenant() {
    let lanes = TenantLanes::new(4);
    let (made, make) = counter();
    assert_eq!(
        made.load(Ordering::SeqCst),
        0,
        "nothing before the first use"
    );
    assert_eq!(lanes.stats(GpuIsolation::StreamPerTenant).live, 0);
    let first = lanes.get_or_create(&key("tn-a"), make.clone()).unwrap();
    assert_eq!(made.load(Ordering::SeqCst), 1);
    for _ in 0..10 {
        let again = lanes.get_or_create(&key("tn-a"), make.clone()).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "same tenant, same lane");
    }
    assert_eq!(made.load(Ordering::SeqCst), 1);
    let stats = lanes.stats(GpuIsolation::StreamPerTenant);
    assert_eq!((stats.live, stats.created, stats.evicted), (1, 1, 0));
}

#[test]
fn different_tenants_get_different_lanes() {
    let lanes = TenantLanes::new(4);
    let (_, make) = counter();
    let a = lanes.get_or_create(&key("tn-a"), make.clone()).unwrap();
    let b = lanes.get_or_create(&key("tn-b"), make.clone()).unwrap();
    let none = lanes
        .get_or_create(&TenantKey::default(), make.clone())
        .unwrap();
    assert!(!Arc::ptr_eq(&a, &b));
    assert!(!Arc::ptr_eq(&a, &none) && !Arc::ptr_eq(&b, &none));
    assert!(Arc::ptr_eq(
        &a,
        &lanes.get_or_create(&key("tn-a"), make.clone()).unwrap()
    ));
    assert!(Arc::ptr_eq(
        &b,
        &lanes.get_or_create(&key("tn-b"), make).unwrap()
    ));
    assert_eq!(lanes.stats(GpuIsolation::ContextPerTenant).live, 3);
}

#[test]
fn the_cap_forgets_the_least_recently_used_tenant() {
    let lanes = TenantLanes::new(2);
    let (made, make) = counter();
    let a = lanes.get_or_create(&key("a"), make.clone()).unwrap();
    let b = lanes.get_or_create(&key("b"), make.clone()).unwrap();
    // `a` is used again, so `b` is now the least recently used.
    lanes.get_or_create(&key("a"), make.clone()).unwrap();
    let c = lanes.get_or_create(&key("c"), make.clone()).unwrap();
    let stats = lanes.stats(GpuIsolation::StreamPerTenant);
    assert_eq!(
        (stats.capacity, stats.live, stats.created, stats.evicted),
        (2, 2, 3, 1)
    );
    // `a` and `c` are still there; `b` comes back as a new lane (evicting `a`, now the
    // least recently used).
    assert!(Arc::ptr_eq(
        &c,
        &lanes.get_or_create(&key("c"), make.clone()).unwrap()
    ));
    assert!(Arc::ptr_eq(
        &a,
        &lanes.get_or_create(&key("a"), make.clone()).unwrap()
    ));
    assert_eq!(made.load(Ordering::SeqCst), 3);
    let b_again = lanes.get_or_create(&key("b"), make.clone()).unwrap();
    assert!(!Arc::ptr_eq(&b, &b_again));
    assert_eq!(made.load(Ordering::SeqCst), 4);
    let stats = lanes.stats(GpuIsolation::StreamPerTenant);
    assert_eq!((stats.live, stats.evicted), (2, 2));
    // The holder of an evicted lane keeps it working: eviction only forgets it.
    assert_eq!(*b, 1);
}

#[test]
fn a_capacity_of_zero_still_holds_one_lane() {
    let lanes = TenantLanes::new(0);
    let (_, make) = counter();
    let a = lanes.get_or_create(&key("a"), make.clone()).unwrap();
    assert!(Arc::ptr_eq(
        &a,
        &lanes.get_or_create(&key("a"), make).unwrap()
    ));
    assert_eq!(lanes.stats(GpuIsolation::StreamPerTenant).capacity, 1);
}

#[test]
fn failed_creation_is_not_kept() {
    let lanes: TenantLanes<Lane> = TenantLanes::new(2);
    let error = GpuError::Cuda(String::from("CUDA_ERROR_OUT_OF_MEMORY"));
    assert_eq!(
        lanes.get_or_create(&key("a"), || Err(error.clone())),
        Err(error)
    );
    let stats = lanes.stats(GpuIsolation::ContextPerTenant);
    assert_eq!((stats.live, stats.created), (0, 0));
    let (made, make) = counter();
    lanes.get_or_create(&key("a"), make).unwrap();
    assert_eq!(made.load(Ordering::SeqCst), 1);
    assert_eq!(lanes.stats(GpuIsolation::ContextPerTenant).created, 1);
}

#[test]
fn concurrent_first_uses_of_one_tenant_create_one_lane() {
    let lanes = Arc::new(TenantLanes::new(8));
    let (made, make) = counter();
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (lanes, make, barrier) = (lanes.clone(), make.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                lanes
                    .get_or_create(&key("tn-shared"), || {
                        // Slow creation, like a context: the others wait for this
                        // one (a widened race window, not synchronisation).
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        make()
                    })
                    .unwrap()
            })
        })
        .collect();
    let got: Vec<Lane> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(made.load(Ordering::SeqCst), 1);
    assert!(got.iter().all(|lane| Arc::ptr_eq(lane, &got[0])));
}

/// A lane whose drop looks at the map: dropping it under the map's lock would deadlock.
struct Reentrant {
    lanes: Arc<TenantLanes<Arc<Reentrant>>>,
    drops: Arc<AtomicUsize>,
}

impl Drop for Reentrant {
    fn drop(&mut self) {
        let _ = self.lanes.stats(GpuIsolation::StreamPerTenant);
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn evicted_lanes_are_dropped_outside_the_lock() {
    let lanes = Arc::new(TenantLanes::new(1));
    let drops = Arc::new(AtomicUsize::new(0));
    let make = || {
        Ok(Arc::new(Reentrant {
            lanes: lanes.clone(),
            drops: drops.clone(),
        }))
    };
    lanes.get_or_create(&key("a"), make).unwrap();
    lanes.get_or_create(&key("b"), make).unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1, "a was evicted and dropped");
    // Break the cycle (the lane holds the map) so the test does not leak.
    drop(lanes.take_all());
    assert_eq!(drops.load(Ordering::SeqCst), 2);
}

#[test]
fn remove_if_forgets_only_an_unwanted_lane() {
    let lanes = TenantLanes::new(4);
    let (made, make) = counter();
    let a = lanes.get_or_create(&key("a"), make.clone()).unwrap();
    let b = lanes.get_or_create(&key("b"), make.clone()).unwrap();
    assert!(!lanes.remove_if(&key("a"), |lane| Arc::ptr_eq(lane, &b)));
    assert!(!lanes.remove_if(&key("nobody"), |_| true));
    assert!(Arc::ptr_eq(
        &a,
        &lanes.get_or_create(&key("a"), make.clone()).unwrap()
    ));
    assert!(lanes.remove_if(&key("a"), |lane| Arc::ptr_eq(lane, &a)));
    let stats = lanes.stats(GpuIsolation::ContextPerTenant);
    assert_eq!((stats.live, stats.evicted), (1, 0));
    let replaced = lanes.get_or_create(&key("a"), make.clone()).unwrap();
    assert!(!Arc::ptr_eq(&a, &replaced));
    assert_eq!(made.load(Ordering::SeqCst), 3);
    // `b` was never touched.
    assert!(Arc::ptr_eq(
        &b,
        &lanes.get_or_create(&key("b"), make).unwrap()
    ));
}

#[test]
fn take_all_empties_the_map() {
    let lanes = TenantLanes::new(4);
    let (_, make) = counter();
    for id in ["a", "b", "c"] {
        lanes.get_or_create(&key(id), make.clone()).unwrap();
    }
    let mut taken: Vec<usize> = lanes.take_all().iter().map(|lane| **lane).collect();
    taken.sort_unstable();
    assert_eq!(taken, [0, 1, 2]);
    assert_eq!(lanes.stats(GpuIsolation::StreamPerTenant).live, 0);
}

#[test]
fn isolation_parses_and_prints() {
    for (text, level) in [
        ("stream", GpuIsolation::StreamPerTenant),
        ("context", GpuIsolation::ContextPerTenant),
    ] {
        assert_eq!(text.parse::<GpuIsolation>(), Ok(level));
        assert_eq!(level.to_string(), text);
    }
    assert_eq!(
        " Context-Per-Tenant ".parse::<GpuIsolation>(),
        Ok(GpuIsolation::ContextPerTenant)
    );
    assert_eq!(
        "stream-per-tenant".parse::<GpuIsolation>(),
        Ok(GpuIsolation::StreamPerTenant)
    );
    assert!(matches!(
        "mig".parse::<GpuIsolation>(),
        Err(GpuError::InvalidArgument(_))
    ));
    assert_eq!(GpuIsolation::default(), GpuIsolation::StreamPerTenant);
    assert_eq!(
        GpuIsolation::StreamPerTenant.lane_capacity(),
        MAX_TENANT_STREAMS
    );
    assert_eq!(
        GpuIsolation::ContextPerTenant.lane_capacity(),
        MAX_TENANT_CONTEXTS
    );
}

/// A lane stand-in of the mixed map: which creation made it, and for which level.
type LevelLane = Arc<(usize, GpuIsolation)>;

fn level_counter() -> (
    Arc<AtomicUsize>,
    impl Fn(GpuIsolation) -> Result<LevelLane, GpuError> + Clone,
) {
    let made = Arc::new(AtomicUsize::new(0));
    let make = {
        let made = made.clone();
        move |level| Ok(Arc::new((made.fetch_add(1, Ordering::SeqCst), level)))
    };
    (made, make)
}

#[test]
fn the_lane_map_holds_both_kinds_at_once() {
    for default in [
        GpuIsolation::StreamPerTenant,
        GpuIsolation::ContextPerTenant,
    ] {
        let other = match default {
            GpuIsolation::StreamPerTenant => GpuIsolation::ContextPerTenant,
            GpuIsolation::ContextPerTenant => GpuIsolation::StreamPerTenant,
        };
        let lanes = TenantLaneMap::new(default);
        let (made, make) = level_counter();
        let plain = key("tn-plain");
        let own = key("tn-own").with_isolation(other);
        let pinned = key("tn-pinned").with_isolation(default);
        assert_eq!(lanes.level_of(&plain), default);
        assert_eq!(lanes.level_of(&own), other);
        assert_eq!(lanes.level_of(&pinned), default);

        let (p, p_level) = lanes.get_or_create(&plain, make.clone()).unwrap();
        let (o, o_level) = lanes.get_or_create(&own, make.clone()).unwrap();
        let (q, _) = lanes.get_or_create(&pinned, make.clone()).unwrap();
        // Each lane was created for the level of its tenant, and is reported with it.
        assert_eq!((p.1, p_level), (default, default));
        assert_eq!((o.1, o_level), (other, other));
        assert_eq!(q.1, default);
        assert_eq!(made.load(Ordering::SeqCst), 3);
        // Tenants keep their lanes.
        assert!(Arc::ptr_eq(
            &p,
            &lanes.get_or_create(&plain, make.clone()).unwrap().0
        ));
        assert!(Arc::ptr_eq(
            &o,
            &lanes.get_or_create(&own, make.clone()).unwrap().0
        ));
        // Naming the default level explicitly reaches the lane of the key without one.
        assert!(Arc::ptr_eq(
            &p,
            &lanes
                .get_or_create(&plain.clone().with_isolation(default), make.clone())
                .unwrap()
                .0
        ));
        assert_eq!(made.load(Ordering::SeqCst), 3);
        // Each kind is counted in its own map, with its own capacity.
        let (defaults, others) = (lanes.stats(default), lanes.stats(other));
        assert_eq!((defaults.isolation, defaults.live), (default, 2));
        assert_eq!((others.isolation, others.live), (other, 1));
        assert_eq!(defaults.capacity, default.lane_capacity());
        assert_eq!(others.capacity, other.lane_capacity());
    }
}

#[test]
fn a_tenant_whose_level_changes_gets_a_lane_of_the_other_kind() {
    let lanes = TenantLaneMap::new(GpuIsolation::StreamPerTenant);
    let (made, make) = level_counter();
    let stream = key("tn-a");
    let context = key("tn-a").with_isolation(GpuIsolation::ContextPerTenant);
    let (s, _) = lanes.get_or_create(&stream, make.clone()).unwrap();
    let (c, level) = lanes.get_or_create(&context, make.clone()).unwrap();
    assert_eq!(level, GpuIsolation::ContextPerTenant);
    assert!(!Arc::ptr_eq(&s, &c));
    assert_eq!(
        (s.1, c.1),
        (
            GpuIsolation::StreamPerTenant,
            GpuIsolation::ContextPerTenant
        )
    );
    // Both stay known, each in its own map; asking at either level finds its lane again.
    assert!(Arc::ptr_eq(
        &s,
        &lanes.get_or_create(&stream, make.clone()).unwrap().0
    ));
    assert!(Arc::ptr_eq(
        &c,
        &lanes.get_or_create(&context, make.clone()).unwrap().0
    ));
    assert_eq!(made.load(Ordering::SeqCst), 2);
    // Removing at one level leaves the other.
    assert!(lanes.remove_if(&context, |_| true));
    assert_eq!(lanes.stats(GpuIsolation::ContextPerTenant).live, 0);
    assert_eq!(lanes.stats(GpuIsolation::StreamPerTenant).live, 1);
    assert!(!lanes.remove_if(&context, |_| true));
    assert!(Arc::ptr_eq(
        &s,
        &lanes.get_or_create(&stream, make).unwrap().0
    ));
}

#[test]
fn each_kind_of_lane_is_bounded_on_its_own() {
    let lanes = TenantLaneMap::with_capacities(GpuIsolation::StreamPerTenant, 3, 1);
    let (_, make) = level_counter();
    let ctx = |id: &str| key(id).with_isolation(GpuIsolation::ContextPerTenant);
    for id in ["s1", "s2", "s3"] {
        lanes.get_or_create(&key(id), make.clone()).unwrap();
    }
    let (first_context, _) = lanes.get_or_create(&ctx("c1"), make.clone()).unwrap();
    // A second context tenant evicts the first context lane, not a stream lane.
    lanes.get_or_create(&ctx("c2"), make.clone()).unwrap();
    let contexts = lanes.stats(GpuIsolation::ContextPerTenant);
    let streams = lanes.stats(GpuIsolation::StreamPerTenant);
    assert_eq!((contexts.live, contexts.evicted), (1, 1));
    assert_eq!((streams.live, streams.evicted), (3, 0));
    let (again, _) = lanes.get_or_create(&ctx("c1"), make.clone()).unwrap();
    assert!(!Arc::ptr_eq(&first_context, &again));
    // A fourth stream tenant evicts a stream lane only.
    lanes.get_or_create(&key("s4"), make).unwrap();
    let streams = lanes.stats(GpuIsolation::StreamPerTenant);
    assert_eq!((streams.live, streams.evicted), (3, 1));
    assert_eq!(lanes.stats(GpuIsolation::ContextPerTenant).live, 1);
    // Every live lane of both kinds comes back from take_all.
    let mut taken: Vec<GpuIsolation> = lanes.take_all().iter().map(|lane| lane.1).collect();
    taken.sort_unstable();
    assert_eq!(
        taken,
        [
            GpuIsolation::StreamPerTenant,
            GpuIsolation::StreamPerTenant,
            GpuIsolation::StreamPerTenant,
            GpuIsolation::ContextPerTenant
        ]
    );
    assert_eq!(lanes.stats(GpuIsolation::StreamPerTenant).live, 0);
    assert_eq!(lanes.stats(GpuIsolation::ContextPerTenant).live, 0);
}

#[test]
fn tenant_keys_carry_a_level() {
    let plain = TenantKey::new("tn-1");
    assert_eq!(plain.isolation(), None);
    let own = plain.clone().with_isolation(GpuIsolation::ContextPerTenant);
    assert_eq!(own.isolation(), Some(GpuIsolation::ContextPerTenant));
    assert_eq!(own.as_str(), "tn-1");
    assert_eq!(own.to_string(), "tn-1", "Display shows the id only");
    assert_ne!(plain, own, "keys are equal when id and level are");
    assert!(plain.same_tenant(&own) && own.same_tenant(&plain));
    assert!(!plain.same_tenant(&TenantKey::new("tn-2")));
    assert_eq!(
        format!("{own:?}"),
        "TenantKey(\"tn-1\", context)",
        "Debug shows a level that was named"
    );
    assert_eq!(own.id_only(), plain);
}

#[test]
fn tenant_keys_compare_by_text() {
    assert_eq!(
        TenantKey::new("tn-1"),
        TenantKey::from(String::from("tn-1"))
    );
    assert_eq!(TenantKey::from(Arc::<str>::from("tn-1")), "tn-1".into());
    assert_ne!(TenantKey::new("tn-1"), TenantKey::new("tn-2"));
    assert_eq!(TenantKey::default().as_str(), "");
    assert_eq!(TenantKey::new("tn-1").to_string(), "tn-1");
    assert_eq!(
        format!("{:?}", TenantKey::new("tn-1")),
        "TenantKey(\"tn-1\")"
    );
}
