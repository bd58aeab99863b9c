use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
    jiff::Timestamp,
};

use super::*;
use crate::reconcile::nodeset::fixtures::{nodeset, pod};

fn rev(ns: &NodeSet, hash: &str, number: i64) -> Arc<ControllerRevision> {
    let mut r = new_revision(ns, hash, number).unwrap_or_else(|e| panic!("{e}"));
    r.metadata.uid = Some(format!("uid-{hash}"));
    r.metadata.creation_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    Arc::new(r)
}

fn names(revs: &[Arc<ControllerRevision>]) -> Vec<String> {
    revs.iter().map(|r| r.name_any()).collect()
}

#[test]
fn a_revision_is_labelled_owned_and_named_for_the_pods() {
    let ns = nodeset("w", 1);
    let r = new_revision(&ns, "abc", 4).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.name_any(), "w-abc");
    assert_eq!(number(&r), 4);
    assert!(labelled(&ns, &r, "abc"), "{:?}", r.labels());
    assert_eq!(
        r.labels().len(),
        3,
        "selector labels and the hash: {:?}",
        r.labels()
    );
    assert_eq!(controller_uid(&r), Some("uid-w"));
    let data = r.data.0;
    assert_eq!(data["spec"]["extraConf"], Value::Null, "{data}");
}

#[test]
fn history_is_the_nodesets_own_and_its_orphans_in_number_order() {
    let (ns, other) = (nodeset("w", 1), nodeset("v", 1));
    let (writer_store, store) = {
        let (reader, writer) = kube::runtime::reflector::store::<ControllerRevision>();
        (writer, reader)
    };
    let mut w = writer_store;
    let mut foreign = (*rev(&ns, "f", 1)).clone();
    foreign.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: "w".into(),
        uid: "sts".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    let mut orphan = (*rev(&ns, "o", 2)).clone();
    orphan.metadata.owner_references = None;
    let mut unlabelled = (*rev(&ns, "u", 9)).clone();
    unlabelled.metadata.labels = None;
    for r in [
        (*rev(&ns, "c", 5)).clone(),
        (*rev(&ns, "a", 3)).clone(),
        (*rev(&other, "x", 4)).clone(),
        foreign,
        orphan,
        unlabelled,
    ] {
        w.apply_watcher_event(&kube::runtime::watcher::Event::Apply(r));
    }
    assert_eq!(names(&history_of(&ns, &store)), ["w-o", "w-a", "w-c"]);
}

#[test]
fn new_revisions_follow_the_highest_and_a_rollback_is_renumbered() {
    let ns = nodeset("w", 1);
    assert_eq!(plan_update("w-a", &[]), Update::Create(1));
    let history = vec![rev(&ns, "a", 1), rev(&ns, "b", 2)];
    assert_eq!(plan_update("w-c", &history), Update::Create(3));
    assert_eq!(plan_update("w-b", &history), Update::Current);
    assert_eq!(plan_update("w-a", &history), Update::Bump(0, 3));
    // Equal numbers: the later created (then the greater name) is the latest.
    let mut tie = (*rev(&ns, "z", 2)).clone();
    tie.metadata.creation_timestamp = Some(Time(Timestamp::from_second(60).unwrap_or(Timestamp::UNIX_EPOCH)));
    let mut history = vec![Arc::new(tie), rev(&ns, "b", 2)];
    sort(&mut history);
    assert_eq!(names(&history), ["w-b", "w-z"]);
    assert_eq!(plan_update("w-b", &history), Update::Bump(0, 3));
}

#[test]
fn truncation_keeps_the_limit_the_update_and_what_pods_run() {
    let ns = nodeset("w", 3);
    let history: Vec<_> = ["a", "b", "c", "d", "e"]
        .iter()
        .enumerate()
        .map(|(i, h)| rev(&ns, h, i as i64 + 1))
        .collect();
    // Pods run b (the old revision mid-rollout) and e (the update); one b is terminating.
    let pods = vec![
        pod(&ns, 0).revision("b").owned().arc(),
        pod(&ns, 1).revision("e").owned().arc(),
        pod(&ns, 2).revision("b").owned().terminating().arc(),
    ];
    let live = live_revisions(&ns, "e", &pods);
    assert_eq!(live, BTreeSet::from(["w-b".to_string(), "w-e".to_string()]));
    assert_eq!(names(&plan_truncate(&history, &live, 0)), ["w-a", "w-c", "w-d"]);
    assert_eq!(
        names(&plan_truncate(&history, &live, 1)),
        ["w-a", "w-c"],
        "lowest first"
    );
    assert!(plan_truncate(&history, &live, 3).is_empty());
    assert!(plan_truncate(&history, &live, 10).is_empty());
    // Once every pod runs e, b goes too.
    let live = live_revisions(&ns, "e", &[]);
    assert_eq!(names(&plan_truncate(&history, &live, 1)), ["w-a", "w-b", "w-c"]);
}

#[test]
fn adoption_adds_the_nodeset_as_controller_and_keeps_other_owners() {
    let ns = nodeset("w", 1);
    let mut orphan = (*rev(&ns, "o", 2)).clone();
    let plain = OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "keep".into(),
        uid: "cm".into(),
        ..Default::default()
    };
    orphan.metadata.owner_references = Some(vec![plain.clone()]);
    let patch = adoption_patch(&ns, &orphan, None);
    let refs: Vec<OwnerReference> =
        serde_json::from_value(patch["metadata"]["ownerReferences"].clone()).unwrap_or_default();
    assert_eq!(refs.len(), 2, "{patch}");
    assert_eq!(refs[0], plain);
    assert_eq!((refs[1].uid.as_str(), refs[1].controller), ("uid-w", Some(true)));
    assert!(patch["metadata"].get("labels").is_none());
    let relabel = adoption_patch(&ns, &orphan, Some("o"));
    assert_eq!(relabel["metadata"]["labels"][keys::LABEL_REVISION_HASH], "o");
    assert_eq!(relabel["metadata"]["labels"][keys::LABEL_INSTANCE], "w");
}
