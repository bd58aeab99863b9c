use std::collections::BTreeMap;

use super::*;
use crate::reconcile::nodeset::fixtures::{nodeset, pod};

/// Pod names and their Slurm nodes.
fn names(pods: &[Arc<Pod>]) -> BTreeMap<String, String> {
    pods.iter().map(|p| (p.name_any(), node_name(p))).collect()
}

const START: i64 = 1_748_743_200;

fn window(flags: &[&str]) -> Window {
    let mut flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    flags.extend(["IGNORE_JOBS".to_string(), "MAINT".to_string()]);
    flags.sort();
    flags.dedup();
    Window {
        start: START,
        end: START + 1800,
        flags,
        recurs: None,
    }
}

fn wanted(nodes: &[&str]) -> Wanted {
    Wanted {
        name: "SlurmOperatorMaint-w".into(),
        window: window(&[]),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
    }
}

fn slurm(start: i64, end: i64, nodes: &str, flags: &[&str]) -> Reservation {
    Reservation {
        name: "SlurmOperatorMaint-w".into(),
        start_time: Some(start),
        end_time: Some(end),
        flags: flags.iter().map(|f| f.to_string()).collect(),
        node_list: nodes.into(),
        users: "slurm".into(),
    }
}

const FLAGS: [&str; 3] = ["MAINT", "IGNORE_JOBS", "SPEC_NODES"];

#[test]
fn a_future_window_is_created_as_declared_and_then_kept() {
    let w = wanted(&["w-0", "w-1"]);
    let Step::Create(r) = decide(Some(&w), None, START - 600) else {
        panic!("not created");
    };
    assert_eq!((r.start_time, r.end_time), (Some(START), Some(START + 1800)));
    assert_eq!(r.flags, ["IGNORE_JOBS", "MAINT"]);
    assert_eq!(r.users, ["slurm"]);
    assert_eq!(
        r.nodes.as_deref(),
        Some(&["w-0".to_string(), "w-1".to_string()][..])
    );
    let made = slurm(START, START + 1800, "w-[0-1]", &FLAGS);
    assert_eq!(decide(Some(&w), Some(&made), START - 590), Step::Keep);
    assert_eq!(decide(Some(&w), Some(&made), START + 10), Step::Keep, "active");
}

#[test]
fn a_begun_window_is_reserved_from_now_and_that_is_in_step() {
    let w = wanted(&["w-0"]);
    let now = START + 900;
    let Step::Create(r) = decide(Some(&w), None, now) else {
        panic!("not created");
    };
    assert_eq!((r.start_time, r.end_time), (Some(now), Some(START + 1800)));
    let made = slurm(now, START + 1800, "w-0", &FLAGS);
    assert_eq!(decide(Some(&w), Some(&made), now + 30), Step::Keep);
}

#[test]
fn an_ended_window_is_not_made_again() {
    let w = wanted(&["w-0"]);
    assert_eq!(decide(Some(&w), None, START + 1800), Step::Keep);
    // Still listed at its end: Slurm removes it.
    let ending = slurm(START, START + 1800, "w-0", &FLAGS);
    assert_eq!(decide(Some(&w), Some(&ending), START + 1801), Step::Keep);
    // One for another window goes.
    let other = slurm(START + 86_400, START + 88_200, "w-0", &FLAGS);
    assert_eq!(decide(Some(&w), Some(&other), START + 1801), Step::Delete(None));
}

#[test]
fn nodes_follow_the_nodeset_even_in_an_active_window() {
    let made = slurm(START, START + 1800, "w-[0-1]", &FLAGS);
    let w = wanted(&["w-0", "w-1", "w-2"]);
    let Step::Update(r) = decide(Some(&w), Some(&made), START + 60) else {
        panic!("not updated");
    };
    assert_eq!(
        r.nodes.map(|n| slinky_slurm::hostlist::compress(&n)).as_deref(),
        Some("w-[0-2]")
    );
    assert_eq!((r.start_time, r.end_time), (None, None), "only the nodes");
    assert!(r.flags.is_empty(), "flags untouched");
}

#[test]
fn a_node_list_that_cannot_be_read_is_not_rewritten_every_pass() {
    let made = slurm(START, START + 1800, "w-[0-", &FLAGS);
    assert!(made.nodes().is_err(), "the list is unreadable");
    let w = wanted(&["w-0", "w-1"]);
    assert_eq!(decide(Some(&w), Some(&made), START + 60), Step::Keep);
}

#[test]
fn a_moved_window_is_updated_before_it_begins_and_replaced_after() {
    let made = slurm(START + 3600, START + 5400, "w-0", &FLAGS);
    let w = wanted(&["w-0"]);
    let Step::Update(r) = decide(Some(&w), Some(&made), START - 600) else {
        panic!("not updated");
    };
    assert_eq!((r.start_time, r.end_time), (Some(START), Some(START + 1800)));
    // startTime patched to now while the old window is still ahead: updated to start now.
    let Step::Update(r) = decide(Some(&w), Some(&made), START + 5) else {
        panic!("not updated");
    };
    assert_eq!(r.start_time, Some(START + 5));
    // Begun: only the end moves.
    let begun = slurm(START, START + 600, "w-0", &FLAGS);
    let Step::Update(r) = decide(Some(&w), Some(&begun), START + 60) else {
        panic!("not updated");
    };
    assert_eq!((r.start_time, r.end_time), (None, Some(START + 1800)));
    // Begun, and the spec moved the start later: made again.
    let later = Wanted {
        window: Window {
            start: START + 7200,
            end: START + 9000,
            flags: window(&[]).flags,
            recurs: None,
        },
        ..w.clone()
    };
    assert!(matches!(
        decide(Some(&later), Some(&begun), START + 60),
        Step::Delete(Some(_))
    ));
}

#[test]
fn other_flags_or_users_are_replaced_and_slurms_own_flags_ignored() {
    let w = Wanted {
        window: window(&["FLEX"]),
        ..wanted(&["w-0"])
    };
    let made = slurm(
        START,
        START + 1800,
        "w-0",
        &["MAINT", "IGNORE_JOBS", "SPEC_NODES"],
    );
    assert!(matches!(
        decide(Some(&w), Some(&made), START - 60),
        Step::Delete(Some(_))
    ));
    let flex = slurm(
        START,
        START + 1800,
        "w-0",
        &["MAINT", "IGNORE_JOBS", "FLEX", "SPEC_NODES"],
    );
    assert_eq!(decide(Some(&w), Some(&flex), START - 60), Step::Keep);
    let mut root = flex.clone();
    root.users = "root".into();
    assert!(matches!(
        decide(Some(&w), Some(&root), START - 60),
        Step::Delete(Some(_))
    ));
}

#[test]
fn not_wanted_is_deleted_and_no_nodes_keeps_what_is_there() {
    let made = slurm(START, START + 1800, "w-0", &FLAGS);
    assert_eq!(decide(None, Some(&made), START - 60), Step::Delete(None));
    assert_eq!(decide(None, None, START - 60), Step::Keep);
    let none = wanted(&[]);
    assert_eq!(decide(Some(&none), None, START - 60), Step::Keep);
    assert_eq!(decide(Some(&none), Some(&made), START - 60), Step::Keep);
}

#[test]
fn the_window_lets_go_the_pods_of_the_nodes_it_holds_while_active() {
    let ns = nodeset("w", 3);
    let pods: Vec<Arc<Pod>> = (0..3).map(|o| pod(&ns, o).owned().arc()).collect();
    let by_pod = names(&pods);
    let node = |o: usize| by_pod.get(&format!("w-{o}")).cloned().unwrap_or_default();
    let r = slurm(START, START + 1800, &format!("{},{}", node(0), node(2)), &FLAGS);
    assert!(in_window(&r, &pods, START - 1).is_empty(), "not begun");
    assert_eq!(
        in_window(&r, &pods, START).into_iter().collect::<Vec<_>>(),
        ["w-0", "w-2"]
    );
    assert!(in_window(&r, &pods, START + 1800).is_empty(), "ended");
}

#[test]
fn a_daily_window_follows_slurms_occurrences_without_churn() {
    let daily = Window {
        recurs: Some("DAILY"),
        ..window(&["DAILY"])
    };
    let wanted_at = |now: i64| Wanted {
        window: daily.at(now),
        ..wanted(&["w-0"])
    };
    let flags = ["MAINT", "IGNORE_JOBS", "DAILY", "SPEC_NODES"];
    // Created for the first occurrence, with its flag.
    let Step::Create(r) = decide(Some(&wanted_at(START - 60)), None, START - 60) else {
        panic!("not created");
    };
    assert_eq!(r.flags, ["DAILY", "IGNORE_JOBS", "MAINT"]);
    // Open now: kept.
    let first = slurm(START, START + 1800, "w-0", &flags);
    assert_eq!(
        decide(Some(&wanted_at(START + 60)), Some(&first), START + 60),
        Step::Keep
    );
    // Just ended, Slurm has not advanced it yet: left to Slurm, not made again.
    assert_eq!(
        decide(Some(&wanted_at(START + 1805)), Some(&first), START + 1805),
        Step::Keep
    );
    // Advanced by Slurm to the next day: that is the occurrence wanted.
    let second = slurm(START + 86_400, START + 86_400 + 1800, "w-0", &flags);
    assert_eq!(
        decide(Some(&wanted_at(START + 1900)), Some(&second), START + 1900),
        Step::Keep
    );
    // A one-off reservation where a daily one is wanted: made again with the flag.
    let once = slurm(START + 86_400, START + 86_400 + 1800, "w-0", &FLAGS);
    assert!(matches!(
        decide(Some(&wanted_at(START + 1900)), Some(&once), START + 1900),
        Step::Delete(Some(_))
    ));
}
