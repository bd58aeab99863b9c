// The example cluster's Controller and NodeSet (`examples/slurm-cluster.yaml`), the inputs the
// benchmark and the profiling example build with. Included by both.

/// The first Controller and NodeSet of `examples/slurm-cluster.yaml`.
fn example_parents() -> anyhow::Result<(slinky_api::NodeSet, slinky_api::Controller)> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/slurm-cluster.yaml");
    let text = std::fs::read_to_string(&path)?;
    let (mut nodeset, mut controller) = (None, None);
    for doc in text.split("\n---") {
        let value: serde_json::Value = serde_saphyr::from_str(doc)?;
        match value["kind"].as_str() {
            Some("Controller") if controller.is_none() => controller = Some(serde_json::from_value(value)?),
            Some("NodeSet") if nodeset.is_none() => nodeset = Some(serde_json::from_value(value)?),
            _ => {}
        }
    }
    match (nodeset, controller) {
        (Some(n), Some(c)) => Ok((n, c)),
        _ => anyhow::bail!("{} has no Controller and NodeSet", path.display()),
    }
}
