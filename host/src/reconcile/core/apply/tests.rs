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
