use super::*;
use crate::reconcile::nodeset::{
    classify::classify,
    fixtures::{nodeset, pod},
};

fn run(ns: &NodeSet, pods: Vec<Arc<Pod>>) -> Plan {
    run_with(ns, pods, &BTreeMap::new(), None)
}

/// [`run`] with Slurm's ranks and a scheduled update's window.
fn run_with(
    ns: &NodeSet,
    pods: Vec<Arc<Pod>>,
    ranks: &BTreeMap<String, u8>,
    window: Option<&BTreeSet<String>>,
) -> Plan {
    let claims = classify(ns, pods);
    plan(&Inputs {
        nodeset: ns,
        revision: "rev1",
        owned: &claims.owned,
        blocked: &claims.blocked,
        leaving: &claims.leaving,
        now: Timestamp::now(),
        update_ranks: ranks,
        window,
        unjudged: &Default::default(),
    })
}

fn deleted(p: &Plan) -> Vec<String> {
    p.deletes.iter().map(|(p, _)| p.name_any()).collect()
}

#[test]
fn scale_up_fills_the_lowest_free_ordinals_and_skips_strangers() {
    let w = nodeset("w", 4);
    let p = run(
        &w,
        vec![
            pod(&w, 0).owned().arc(),
            pod(&w, 1).stranger("ReplicaSet", "web").arc(),
        ],
    );
    assert_eq!(p.creates, [2, 3, 4], "ordinal 1 counts as used");
    assert_eq!(p.skipped.len(), 1);
    assert_eq!(p.skipped[0].1.pod, "w-1");
    assert!(p.deletes.is_empty());
    // A stranger above the created ordinals is not reported as skipped.
    let w = nodeset("w", 2);
    let p = run(&w, vec![pod(&w, 5).stranger("ReplicaSet", "web").arc()]);
    assert_eq!(p.creates, [0, 1]);
    assert!(p.skipped.is_empty());
}

#[test]
fn a_terminating_ordinal_is_waited_for_not_replaced_by_a_new_one() {
    let w = nodeset("w", 3);
    let pods = vec![
        pod(&w, 0).owned().arc(),
        pod(&w, 1).owned().terminating().arc(),
        pod(&w, 2).owned().arc(),
    ];
    let p = run(&w, pods);
    assert!(p.creates.is_empty(), "no new ordinal: {:?}", p.creates);
    assert_eq!(p.waiting, [1]);
    assert!(p.deletes.is_empty());
    // Once it is gone, the same ordinal comes back.
    let p = run(&w, vec![pod(&w, 0).owned().arc(), pod(&w, 2).owned().arc()]);
    assert_eq!(p.creates, [1]);
}

#[test]
fn a_failed_pod_is_deleted_and_its_ordinal_recreated_afterwards() {
    let w = nodeset("w", 3);
    let pods = vec![
        pod(&w, 0).owned().arc(),
        pod(&w, 1).owned().phase("Failed").arc(),
        pod(&w, 2).owned().arc(),
    ];
    let p = run(&w, pods);
    assert_eq!(deleted(&p), ["w-1"]);
    assert_eq!(p.deletes[0].1, DeleteReason::Finished);
    assert!(p.creates.is_empty());
    assert_eq!(p.waiting, [1]);
}

#[test]
fn scale_up_during_a_scale_down_waits_for_the_terminating_ordinals() {
    let w = nodeset("w", 5);
    let pods = vec![
        pod(&w, 0).owned().arc(),
        pod(&w, 1).owned().arc(),
        pod(&w, 2).owned().arc(),
        pod(&w, 4).owned().terminating().arc(),
    ];
    let p = run(&w, pods);
    assert_eq!(p.waiting, [4]);
    assert_eq!(p.creates, [3]);
}

#[test]
fn a_pod_terminating_above_replicas_holds_no_place() {
    // Scaled 6 → 2 with pod 5 stuck terminating on a dead node; then pod 1 failed.
    let w = nodeset("w", 2);
    let pods = vec![
        pod(&w, 0).owned().arc(),
        pod(&w, 1).owned().phase("Failed").arc(),
        pod(&w, 5).owned().terminating().arc(),
    ];
    let p = run(&w, pods);
    assert_eq!(deleted(&p), ["w-1"]);
    assert_eq!(p.waiting, [1], "pod 1 is waited for, not pod 5");
    assert!(p.creates.is_empty());
    // Once pod 1 is gone, it comes back while pod 5 still terminates.
    let p = run(
        &w,
        vec![pod(&w, 0).owned().arc(), pod(&w, 5).owned().terminating().arc()],
    );
    assert_eq!(p.creates, [1]);
    assert!(p.waiting.is_empty());
    // With a stranger holding 1, the NodeSet's ordinals are 0, 2 and 3: 3 is waited for,
    // 7 (above them) is not.
    let w = nodeset("w", 3);
    let pods = vec![
        pod(&w, 0).owned().arc(),
        pod(&w, 1).stranger("ReplicaSet", "web").arc(),
        pod(&w, 2).owned().arc(),
        pod(&w, 3).owned().terminating().arc(),
        pod(&w, 7).owned().terminating().arc(),
    ];
    let p = run(&w, pods);
    assert_eq!(p.waiting, [3]);
    assert!(p.creates.is_empty() && p.skipped.is_empty(), "{p:?}");
}

#[test]
fn a_predecessors_pods_are_waited_for_not_skipped() {
    let w = nodeset("w", 2);
    let pods = vec![
        pod(&w, 0).stranger("NodeSet", "w").arc(),
        pod(&w, 1).orphan().without_selector().terminating().arc(),
    ];
    let p = run(&w, pods);
    assert_eq!(p.waiting, [0, 1]);
    assert!(p.creates.is_empty() && p.skipped.is_empty(), "{p:?}");
}

#[test]
fn scale_down_follows_slinkys_order() {
    let w = nodeset("w", 2);
    let pods = vec![
        pod(&w, 0).owned().arc(),
        pod(&w, 1).owned().deletion_cost(-5).arc(),
        pod(&w, 2).owned().arc(),
        pod(&w, 3).owned().unready().arc(),
        pod(&w, 4).owned().pending().arc(),
    ];
    let p = run(&w, pods);
    assert_eq!(deleted(&p), ["w-4", "w-3", "w-1"]);
    assert!(p.creates.is_empty());
}

#[test]
fn a_scale_down_drains_no_busy_node_while_an_idle_one_can_go() {
    let w = nodeset("w", 9);
    let pods: Vec<Arc<Pod>> = (0..10).map(|o| pod(&w, o).owned().arc()).collect();
    let plan_with = |ranks: &BTreeMap<String, u8>| run_with(&w, pods.clone(), ranks, None);
    assert_eq!(
        deleted(&plan_with(&BTreeMap::new())),
        ["w-9"],
        "without Slurm: the highest ordinal"
    );
    // w-9 runs a 7-day job, the rest are idle: the highest idle one goes.
    let busy = BTreeMap::from([("w-9".to_string(), 2)]);
    assert_eq!(deleted(&plan_with(&busy)), ["w-8"]);
    // Once the host drains a node, that one goes first (a pass does not change its mind).
    let draining = BTreeMap::from([("w-9".to_string(), 2), ("w-3".to_string(), 0)]);
    assert_eq!(deleted(&plan_with(&draining)), ["w-3"]);
    // The gap is filled by the next scale up: the lowest free ordinal.
    let after: Vec<Arc<Pod>> = (0..10)
        .filter(|o| *o != 8)
        .map(|o| pod(&w, o).owned().arc())
        .collect();
    let more = nodeset("w", 10);
    assert_eq!(run(&more, after).creates, [8]);
}

#[test]
fn pod_deadlines_compare_as_times_and_none_goes_first() {
    let w = nodeset("w", 2);
    let pods = vec![
        // 10:00+02:00 is 08:00Z: earlier than 09:00Z, though its text sorts later.
        pod(&w, 0).owned().deadline("2026-11-28T10:00:00+02:00").arc(),
        pod(&w, 1).owned().deadline("2026-11-28T09:00:00Z").arc(),
        pod(&w, 2).owned().arc(),
        pod(&w, 3).owned().deadline("2026-11-28T08:30:00Z").arc(),
    ];
    assert_eq!(
        deleted(&run(&w, pods)),
        ["w-2", "w-0"],
        "no deadline (no job) first, then the earliest"
    );
}

#[test]
fn a_rolling_update_stays_within_max_unavailable_counting_missing_pods() {
    let w = nodeset("w", 8); // 25% of 8 = 2
    let mut pods: Vec<Arc<Pod>> = (0..8).map(|o| pod(&w, o).owned().revision("old").arc()).collect();
    let p = run(&w, pods.clone());
    assert_eq!(deleted(&p), ["w-7", "w-6"]);
    // One replaced pod still terminating: one more may go.
    pods[7] = pod(&w, 7).owned().revision("old").terminating().arc();
    let p = run(&w, pods.clone());
    assert_eq!(p.waiting, [7]);
    assert_eq!(deleted(&p), ["w-6"]);
    // An old unready pod goes at once (it is unavailable already); with a new unready pod
    // that makes 2 unavailable: no healthy old pod may go (Slinky would take one more).
    pods[7] = pod(&w, 7).owned().arc();
    pods[6] = pod(&w, 6).owned().unready().arc();
    pods[0] = pod(&w, 0).owned().revision("old").unready().arc();
    let p = run(&w, pods.clone());
    assert_eq!(deleted(&p), ["w-0"]);
    pods[6] = pod(&w, 6).owned().arc();
    let p = run(&w, pods);
    assert_eq!(deleted(&p), ["w-0", "w-5"], "one unavailable: one more may go");
}

#[test]
fn on_delete_leaves_old_pods_and_wrongly_padded_pods_roll() {
    let mut w = nodeset("w", 2);
    w.spec.update_strategy = Some(slinky_api::UpdateStrategy {
        type_: UpdateStrategyType::OnDelete,
        ..Default::default()
    });
    let p = run(
        &w,
        (0..2).map(|o| pod(&w, o).owned().revision("old").arc()).collect(),
    );
    assert!(p.deletes.is_empty());
    let w = nodeset("w", 2);
    let pods = vec![pod(&w, 0).owned().arc(), pod(&w, 1).owned().named("w-01").arc()];
    let p = run(&w, pods);
    assert_eq!(
        deleted(&p),
        ["w-01"],
        "a pod named with another padding is replaced"
    );
    assert!(p.creates.is_empty(), "its ordinal stays held until it is gone");
}

#[test]
fn a_scheduled_update_replaces_only_what_its_window_holds() {
    let mut w = nodeset("w", 4);
    w.spec.update_strategy = Some(slinky_api::UpdateStrategy {
        type_: UpdateStrategyType::ScheduledUpdate,
        ..Default::default()
    });
    let pods: Vec<Arc<Pod>> = vec![
        pod(&w, 0).owned().revision("old").unready().arc(),
        pod(&w, 1).owned().revision("old").arc(),
        pod(&w, 2).owned().revision("old").arc(),
        pod(&w, 3).owned().revision("old").arc(),
    ];
    let plan_with = |window: Option<&BTreeSet<String>>| run_with(&w, pods.clone(), &BTreeMap::new(), window);
    // Outside the window: the unhealthy old pod only.
    assert_eq!(deleted(&plan_with(None)), ["w-0"]);
    assert_eq!(deleted(&plan_with(Some(&BTreeSet::new()))), ["w-0"]);
    // In it: every healthy old pod it holds, beyond maxUnavailable (25% of 4 = 1).
    let open: BTreeSet<String> = ["w-1", "w-2", "w-3"].iter().map(|s| s.to_string()).collect();
    let mut got = deleted(&plan_with(Some(&open)));
    got.sort();
    assert_eq!(got, ["w-0", "w-1", "w-2", "w-3"]);
    let some: BTreeSet<String> = ["w-2"].iter().map(|s| s.to_string()).collect();
    assert_eq!(deleted(&plan_with(Some(&some))), ["w-0", "w-2"]);
}

#[test]
fn a_scheduled_update_replaces_at_most_a_burst_a_pass() {
    let n = BURST + 50;
    let mut w = nodeset("w", n as i32);
    w.spec.update_strategy = Some(slinky_api::UpdateStrategy {
        type_: UpdateStrategyType::ScheduledUpdate,
        ..Default::default()
    });
    let pods: Vec<Arc<Pod>> = (0..n as u32)
        .map(|o| pod(&w, o).owned().revision("old").arc())
        .collect();
    let open: BTreeSet<String> = pods.iter().map(|p| p.name_any()).collect();
    let p = run_with(&w, pods, &BTreeMap::new(), Some(&open));
    assert_eq!(p.deletes.len(), BURST);
}

#[test]
fn bursts_are_bounded() {
    let w = nodeset("w", CREATE_BURST as i32 + 10);
    assert_eq!(run(&w, Vec::new()).creates.len(), CREATE_BURST);
    let live: Vec<Arc<Pod>> = (0..BURST as u32 + 10)
        .map(|o| pod(&w, o).owned().revision("rev1").arc())
        .collect();
    let w = nodeset("w", 0);
    assert_eq!(run(&w, live).deletes.len(), BURST);
}

#[test]
fn among_busy_nodes_the_one_whose_jobs_end_first_goes_and_one_without_an_end_last() {
    let w = nodeset("w", 2);
    let pods = vec![
        pod(&w, 0).owned().deadline("2026-11-28T10:00:00Z").arc(),
        pod(&w, 1).owned().deadline("2026-11-28T09:00:00Z").arc(),
        pod(&w, 2).owned().arc(),
    ];
    let busy: BTreeMap<String, u8> = ["w-0", "w-1", "w-2"].iter().map(|p| (p.to_string(), 2)).collect();
    assert_eq!(deleted(&run_with(&w, pods.clone(), &busy, None)), ["w-1"]);
    let fewer = nodeset("w", 1);
    assert_eq!(
        deleted(&run_with(&fewer, pods, &busy, None)),
        ["w-1", "w-0"],
        "a job without an end keeps its node longest"
    );
}
