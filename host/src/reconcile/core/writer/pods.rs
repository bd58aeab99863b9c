//! Pod, claim and ControllerRevision writes: creates, deletes with a UID precondition (never a
//! namesake), and patches (adoption, release, relabelling, a revision's number and owners) with a
//! resourceVersion precondition.

use super::*;

/// What an unread create asks back: its object's metadata (`PartialObjectMetadata`), or else
/// the object, both in protobuf.
const UNREAD_ANSWER: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, \
     application/vnd.kubernetes.protobuf";

impl Writer {
    /// Create a pod.
    ///
    /// # Errors
    /// The API error (409 AlreadyExists included).
    pub async fn create_pod(&self, pod: &Pod) -> Result<Pod, kube::Error> {
        self.fence("create")?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let pp = post_params();
        self.write("create", api.create(&pp, pod)).await
    }

    /// Create a pod without reading back what the server stored: its answer (the whole pod,
    /// managedFields included) is skipped over, not decoded (decoding it was about a tenth of
    /// the host's CPU in a scale-up). [`Writer::create_pod`] returns it, for the one pod of a
    /// pass the dropped-fields check compares.
    ///
    /// # Errors
    /// The API error (409 AlreadyExists included).
    pub async fn create_pod_unread(&self, pod: &Pod) -> Result<(), kube::Error> {
        /// What is read of the answer: nothing (serde skips every field without allocating).
        #[derive(serde::Deserialize)]
        struct Skipped {}
        self.fence("create")?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let pp = post_params();
        let create = async {
            if let Some(body) = self.protobuf_body(pod) {
                let mut req = kube::core::Request::new(api.resource_url())
                    .create(&pp, body)
                    .map_err(kube::Error::BuildRequest)?;
                let proto = http::HeaderValue::from_static(slinky_protobuf::MEDIA_TYPE);
                req.headers_mut().insert(http::header::CONTENT_TYPE, proto);
                // The answer (it is not read) as the pod's metadata only, in protobuf: the
                // server encodes and sends a fifth of the pod (kube-apiserver's create answer
                // was ~3.5 % of its CPU in a scale-up). A server that cannot transform it
                // answers the second choice, the pod in protobuf.
                req.headers_mut().insert(
                    http::header::ACCEPT,
                    http::HeaderValue::from_static(UNREAD_ANSWER),
                );
                match self.send_unread(req).await {
                    // 415: it takes no protobuf body; 406: it answers in no protobuf.
                    Err(kube::Error::Api(s)) if s.code == 415 || s.code == 406 => {
                        tracing::info!(code = s.code, message = %s.message, "the API server takes or answers no protobuf pods: creating them as JSON");
                        self.protobuf.store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                    r => return r.map(|_| ()),
                }
            }
            let body = serde_json::to_vec(pod).map_err(kube::Error::SerdeError)?;
            let req = kube::core::Request::new(api.resource_url())
                .create(&pp, body)
                .map_err(kube::Error::BuildRequest)?;
            self.client.request::<Skipped>(req).await.map(|_| ())
        };
        self.write("create", create).await
    }

    /// Send `req` and skip its answer; an error answer (JSON or protobuf) as the API error.
    async fn send_unread(&self, req: http::Request<Vec<u8>>) -> Result<(), kube::Error> {
        use http_body_util::BodyExt;
        let res = self.client.send(req.map(kube::client::Body::from)).await?;
        let status = res.status();
        let ctype = res
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = res.into_body().collect().await?.to_bytes();
        if status.is_success() {
            return Ok(());
        }
        let value = if ctype.starts_with(slinky_protobuf::MEDIA_TYPE) {
            slinky_protobuf::decode(&body).ok()
        } else {
            serde_json::from_slice(&body).ok()
        };
        let api = value
            .and_then(|v| serde_json::from_value::<kube::core::Status>(v).ok())
            .unwrap_or_else(|| {
                kube::core::Status::failure(&String::from_utf8_lossy(&body), "Unknown")
                    .with_code(status.as_u16())
            });
        Err(kube::Error::Api(Box::new(api)))
    }

    /// `pod` in Kubernetes' protobuf encoding, as kube-controller-manager creates pods (the API
    /// server decodes it for a fraction of the CPU JSON costs it): `None` once the server
    /// refused it (415, or 406 for the answer: the host then sends JSON), or when the schema
    /// cannot carry a field of this pod (a field newer than the schema: JSON loses nothing).
    fn protobuf_body(&self, pod: &Pod) -> Option<Vec<u8>> {
        if !self.protobuf.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let value = serde_json::to_value(pod).ok()?;
        match slinky_protobuf::encode_exact(&value) {
            Ok(body) => Some(body),
            Err(path) => {
                tracing::debug!(pod = %pod.name_any(), %path, "the protobuf schema cannot carry this field: the pod is created as JSON");
                None
            }
        }
    }

    /// A pod as the API server has it now (`None` when it is gone): the cache keeps pods slimmed
    /// (see `watch::slim`), so what needs a pod's whole spec reads it here. Counted as `get`
    /// (a read, not a write).
    ///
    /// # Errors
    /// The API error.
    pub async fn get_pod(&self, ns: &str, name: &str) -> Result<Option<Pod>, kube::Error> {
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
    }

    /// What the API server would store for `pod` (defaults set, fields it does not serve
    /// dropped), from a server-side dry run of its creation under a generated name. Nothing is
    /// written; counted as `dry_run`.
    ///
    /// # Errors
    /// The API error.
    pub async fn dry_run_pod(&self, pod: &Pod) -> Result<Pod, kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let mut probe = pod.clone();
        probe.metadata.generate_name = probe.metadata.name.take().map(|n| format!("{n}-"));
        let pp = PostParams {
            dry_run: true,
            field_manager: Some(FIELD_MANAGER.into()),
        };
        let r = api.create(&pp, &probe).await;
        self.metrics.record("dry_run", outcome(&r));
        r
    }

    /// Delete a pod, only if it still has `uid`: `true` when deleted now, `false` when it was
    /// already gone (not an error).
    ///
    /// # Errors
    /// The API error (409 when the name now belongs to another pod).
    pub async fn delete_pod(&self, ns: &str, name: &str, uid: &str) -> Result<bool, kube::Error> {
        self.fence("delete")?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let r = self
            .write("delete", api.delete(name, &uid_precondition(uid)))
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Create a volume claim (a NodeSet pod's, made before the pod); counted as `create_claim`.
    ///
    /// # Errors
    /// The API error (409 AlreadyExists included).
    pub async fn create_claim(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<PersistentVolumeClaim, kube::Error> {
        self.fence("create_claim")?;
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
        let pp = post_params();
        self.write("create_claim", api.create(&pp, claim)).await
    }

    /// Replace a volume claim's owner references (its retention policy), with a resourceVersion
    /// precondition; counted as `patch_claim`.
    ///
    /// # Errors
    /// The API error (409 when the claim changed meanwhile).
    pub async fn set_claim_owners(
        &self,
        claim: &PersistentVolumeClaim,
        owners: Value,
    ) -> Result<PersistentVolumeClaim, kube::Error> {
        self.fence("patch_claim")?;
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
        let patch =
            json!({"metadata": {"resourceVersion": claim.resource_version(), "ownerReferences": owners}});
        let pp = patch_params();
        self.write(
            "patch_claim",
            api.patch(&claim.name_any(), &pp, &Patch::Merge(patch)),
        )
        .await
    }

    /// Create a ControllerRevision; counted as `create_revision`.
    ///
    /// # Errors
    /// The API error (409 AlreadyExists included).
    pub async fn create_revision(&self, rev: &ControllerRevision) -> Result<ControllerRevision, kube::Error> {
        self.fence("create_revision")?;
        let api: Api<ControllerRevision> =
            Api::namespaced(self.client.clone(), &rev.namespace().unwrap_or_default());
        let pp = post_params();
        self.write("create_revision", api.create(&pp, rev)).await
    }

    /// Merge-patch a ControllerRevision (`patch`, a JSON object: its `revision` number, owners or
    /// labels) with the resourceVersion of `rev`, the version the patch was computed from;
    /// counted as `patch_revision`.
    ///
    /// # Errors
    /// The API error (409 when it changed meanwhile).
    pub async fn patch_revision(
        &self,
        rev: &ControllerRevision,
        mut patch: Value,
    ) -> Result<ControllerRevision, kube::Error> {
        self.fence("patch_revision")?;
        if let Some(Value::Object(meta)) = patch
            .as_object_mut()
            .map(|m| m.entry("metadata").or_insert_with(|| json!({})))
        {
            meta.insert("resourceVersion".into(), json!(rev.resource_version()));
        }
        let api: Api<ControllerRevision> =
            Api::namespaced(self.client.clone(), &rev.namespace().unwrap_or_default());
        let pp = patch_params();
        self.write(
            "patch_revision",
            api.patch(&rev.name_any(), &pp, &Patch::Merge(patch)),
        )
        .await
    }

    /// Delete a ControllerRevision, only if it still has `uid`: `true` when deleted now, `false`
    /// when it was already gone; counted as `delete_revision`.
    ///
    /// # Errors
    /// The API error (409 when the name now belongs to another object).
    pub async fn delete_revision(&self, ns: &str, name: &str, uid: &str) -> Result<bool, kube::Error> {
        self.fence("delete_revision")?;
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), ns);
        let r = self
            .write("delete_revision", api.delete(name, &uid_precondition(uid)))
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Replace a pod's owner references (adoption, release), with a resourceVersion precondition.
    ///
    /// # Errors
    /// The API error.
    pub async fn set_pod_owners(&self, pod: &Pod, owners: Value) -> Result<Pod, kube::Error> {
        self.fence("patch")?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let patch =
            json!({"metadata": {"resourceVersion": pod.resource_version(), "ownerReferences": owners}});
        let pp = patch_params();
        self.write("patch", api.patch(&pod.name_any(), &pp, &Patch::Merge(patch)))
            .await
    }

    /// Set a pod's revision label and builder annotations (a pod equal to what the builder
    /// makes, labelled by another revision scheme), and its `tolerations` when given (the whole
    /// list: a running pod accepts additions only), with a resourceVersion precondition.
    ///
    /// # Errors
    /// The API error.
    pub async fn relabel_pod(
        &self,
        pod: &Pod,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        tolerations: Option<&[Toleration]>,
    ) -> Result<Pod, kube::Error> {
        self.fence("patch")?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let mut patch = json!({"metadata": {"resourceVersion": pod.resource_version(),
            "labels": labels, "annotations": annotations}});
        if let Some(t) = tolerations {
            patch["spec"] = json!({"tolerations": t});
        }
        let pp = patch_params();
        self.write("patch", api.patch(&pod.name_any(), &pp, &Patch::Merge(patch)))
            .await
    }

    /// Set (`Some`) or remove (`None`) one label of a pod: a merge patch of that key alone, with
    /// the resourceVersion the decision was made on (a decision made on a stale cache is
    /// refused with a 409, not written).
    ///
    /// # Errors
    /// The API error.
    pub async fn set_pod_label(&self, pod: &Pod, key: &str, value: Option<&str>) -> Result<Pod, kube::Error> {
        self.set_pod_meta(pod, "labels", key, value).await
    }

    /// [`Writer::set_pod_label`] for an annotation.
    ///
    /// # Errors
    /// The API error.
    pub async fn set_pod_annotation(
        &self,
        pod: &Pod,
        key: &str,
        value: Option<&str>,
    ) -> Result<Pod, kube::Error> {
        self.set_pod_meta(pod, "annotations", key, value).await
    }

    async fn set_pod_meta(
        &self,
        pod: &Pod,
        field: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<Pod, kube::Error> {
        self.fence("patch")?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let patch = json!({"metadata": {"resourceVersion": pod.resource_version(), field: {key: value}}});
        let pp = patch_params();
        self.write("patch", api.patch(&pod.name_any(), &pp, &Patch::Merge(patch)))
            .await
    }
}
