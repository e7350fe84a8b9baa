//! The headless Service (peer DNS, cluster port, not-ready addresses published) and the
//! client Service (API port).

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// `<fullname>-headless`: peer DNS for the StatefulSet, published before pods are ready so
/// nodes can find each other while bootstrapping, and while a node fails `/readyz`
/// (draining, shutting down, no longer a member): its peers must still reach its cluster
/// port.
pub fn headless_service(nc: &NaradCluster) -> Service {
    Service {
        metadata: owned_meta(nc, headless_name(nc)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(nc)),
            ports: Some(vec![port("cluster", CLUSTER_PORT)]),
            ..Default::default()
        }),
        status: None,
    }
}

/// `<fullname>`: the client Service (ClusterIP by default) on the API port, and the
/// metrics port when `spec.metricsPort` is set. Ready pods only.
pub fn client_service(nc: &NaradCluster) -> Service {
    let mut meta = owned_meta(nc, nc.fullname());
    if !nc.spec.service.annotations.is_empty() {
        meta.annotations = Some(nc.spec.service.annotations.clone());
    }
    let mut ports = vec![port("api", API_PORT)];
    if let Some(p) = nc.spec.metrics_port {
        ports.push(port("metrics", p));
    }
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some(nc.spec.service.type_.clone()),
            selector: Some(selector_labels(nc)),
            ports: Some(ports),
            // Only ready brokers take client traffic: a draining or departed node fails
            // `/readyz` and leaves the endpoints at once.
            publish_not_ready_addresses: None,
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::cluster;
    use super::*;
    use serde_json::json;

    #[test]
    fn headless() {
        let nc = cluster(json!({"version": "1"}));
        let s = headless_service(&nc);
        assert_eq!(s.metadata.name.as_deref(), Some("prod-narad-headless"));
        let spec = s.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        let p = &spec.ports.unwrap()[0];
        assert_eq!((p.name.as_deref(), p.port), (Some("cluster"), 7943));
        assert_eq!(spec.selector.unwrap(), selector_labels(&nc));
    }

    #[test]
    fn client() {
        let nc = cluster(json!({"version": "1", "service": {
            "type": "LoadBalancer", "annotations": {"lb": "internal"}}}));
        let s = client_service(&nc);
        assert_eq!(s.metadata.name.as_deref(), Some("prod-narad"));
        assert_eq!(s.metadata.annotations.unwrap()["lb"], "internal");
        let spec = s.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        let p = &spec.ports.unwrap()[0];
        assert_eq!((p.name.as_deref(), p.port), (Some("api"), 7942));
        let plain = client_service(&cluster(json!({"version": "1"})));
        assert!(plain.metadata.annotations.is_none());
        let spec = plain.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        // Not-ready (draining, shutting down) brokers take no client traffic.
        assert_ne!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.ports.unwrap().len(), 1);
    }

    #[test]
    fn metrics_port_on_the_client_service() {
        let s = client_service(&cluster(json!({"version": "1", "metricsPort": 9090})));
        let ports: Vec<(Option<String>, i32)> = s
            .spec
            .unwrap()
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name, p.port))
            .collect();
        assert_eq!(
            ports,
            vec![(Some("api".into()), 7942), (Some("metrics".into()), 9090)]
        );
        // Peers only on the headless Service.
        let h = headless_service(&cluster(json!({"version": "1", "metricsPort": 9090})));
        assert_eq!(h.spec.unwrap().ports.unwrap().len(), 1);
    }
}
