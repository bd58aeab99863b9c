use serde_json::json;

use super::*;

#[test]
fn the_applied_hash_follows_the_built_object() {
    let a = json!({"metadata": {"name": "x"}});
    assert_eq!(applied_hash(&a), applied_hash(&a.clone()));
    assert_ne!(
        applied_hash(&a),
        applied_hash(&json!({"metadata": {"name": "y"}}))
    );
}

#[test]
fn an_older_hosts_template_provenance_is_kept() {
    let b = keys::ANNOTATION_BUILDER;
    let live = json!({"spec": {"template": {
        "metadata": {"labels": {"app": "slurmctld"}, "annotations": {b: "old@1", "conf": "h1"}},
        "spec": {"containers": [{"name": "slurmctld", "image": "a", "terminationMessagePath": "/dev/x"}]}}}});
    let built = |image: &str| {
        json!({"spec": {"template": {
            "metadata": {"labels": {"app": "slurmctld"}, "annotations": {"conf": "h1"}},
            "spec": {"containers": [{"name": "slurmctld", "image": image}]}}}})
    };
    let mut same = built("a");
    keep_template_provenance(&live, &mut same);
    assert_eq!(
        same.pointer("/spec/template/metadata/annotations"),
        live.pointer("/spec/template/metadata/annotations"),
        "the template is applied as it is: nothing restarts"
    );
    let mut changed = built("b");
    keep_template_provenance(&live, &mut changed);
    assert_eq!(
        changed.pointer("/spec/template/metadata/annotations"),
        live.pointer("/spec/template/metadata/annotations"),
        "kept with the template's other changes"
    );
    let mut ours = built("a");
    keep_template_provenance(&built("a"), &mut ours);
    assert_eq!(ours, built("a"), "a template without them gets none");
}
