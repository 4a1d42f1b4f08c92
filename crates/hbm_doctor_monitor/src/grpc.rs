//! A hand-written tonic client and server for `tpu.monitoring.runtime.RuntimeMetricService`.
//!
//! The client is what [`crate::libtpu`] uses to read HBM figures from a trainer. The server side
//! ([`RuntimeMetricServiceServer`] over any [`RuntimeMetricService`]) exists so that tests can run
//! a stand-in for libtpu on loopback that speaks the same wire protocol.

use crate::proto::{
    GetTpuRuntimeStatusRequest, GetTpuRuntimeStatusResponse, ListSupportedMetricsRequest,
    ListSupportedMetricsResponse, MetricRequest, MetricResponse,
};
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codegen::{http, Body, BoxFuture, GrpcMethod, StdError};

/// The fully qualified service name.
pub const SERVICE_NAME: &str = "tpu.monitoring.runtime.RuntimeMetricService";

const GET_RUNTIME_METRIC: &str = "/tpu.monitoring.runtime.RuntimeMetricService/GetRuntimeMetric";
const LIST_SUPPORTED_METRICS: &str =
    "/tpu.monitoring.runtime.RuntimeMetricService/ListSupportedMetrics";
const GET_TPU_RUNTIME_STATUS: &str =
    "/tpu.monitoring.runtime.RuntimeMetricService/GetTpuRuntimeStatus";

/// A client of the runtime metrics service over a tonic channel.
#[derive(Debug, Clone)]
pub struct RuntimeMetricClient {
    inner: tonic::client::Grpc<tonic::transport::Channel>,
}

impl RuntimeMetricClient {
    /// Wraps a connected channel.
    pub fn new(channel: tonic::transport::Channel) -> Self {
        Self {
            inner: tonic::client::Grpc::new(channel),
        }
    }

    async fn unary<Req, Resp>(
        &mut self,
        path: &'static str,
        method: &'static str,
        req: Req,
    ) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("service was not ready: {e}")))?;
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        let mut req = tonic::Request::new(req);
        req.extensions_mut()
            .insert(GrpcMethod::new(SERVICE_NAME, method));
        let path = http::uri::PathAndQuery::from_static(path);
        self.inner
            .unary(req, path, codec)
            .await
            .map(tonic::Response::into_inner)
    }

    /// `GetRuntimeMetric`.
    pub async fn get_runtime_metric(
        &mut self,
        req: MetricRequest,
    ) -> Result<MetricResponse, tonic::Status> {
        self.unary(GET_RUNTIME_METRIC, "GetRuntimeMetric", req)
            .await
    }

    /// `ListSupportedMetrics`.
    pub async fn list_supported_metrics(
        &mut self,
        req: ListSupportedMetricsRequest,
    ) -> Result<ListSupportedMetricsResponse, tonic::Status> {
        self.unary(LIST_SUPPORTED_METRICS, "ListSupportedMetrics", req)
            .await
    }

    /// `GetTpuRuntimeStatus`.
    pub async fn get_tpu_runtime_status(
        &mut self,
        req: GetTpuRuntimeStatusRequest,
    ) -> Result<GetTpuRuntimeStatusResponse, tonic::Status> {
        self.unary(GET_TPU_RUNTIME_STATUS, "GetTpuRuntimeStatus", req)
            .await
    }
}

/// The server side of the service: implement this to serve metrics (tests use it as libtpu).
pub trait RuntimeMetricService: Send + Sync + 'static {
    /// `GetRuntimeMetric`.
    fn get_runtime_metric(
        &self,
        req: MetricRequest,
    ) -> impl Future<Output = Result<MetricResponse, tonic::Status>> + Send;
    /// `ListSupportedMetrics`.
    fn list_supported_metrics(
        &self,
        req: ListSupportedMetricsRequest,
    ) -> impl Future<Output = Result<ListSupportedMetricsResponse, tonic::Status>> + Send;
    /// `GetTpuRuntimeStatus` (unimplemented unless overridden, like older libtpu).
    fn get_tpu_runtime_status(
        &self,
        _req: GetTpuRuntimeStatusRequest,
    ) -> impl Future<Output = Result<GetTpuRuntimeStatusResponse, tonic::Status>> + Send {
        async { Err(tonic::Status::unimplemented("GetTpuRuntimeStatus")) }
    }
}

/// A tower service routing the three methods to a [`RuntimeMetricService`]; add it to a
/// `tonic::transport::Server`.
#[derive(Debug)]
pub struct RuntimeMetricServiceServer<T> {
    inner: Arc<T>,
}

impl<T> RuntimeMetricServiceServer<T> {
    /// Wraps an implementation.
    pub fn new(inner: T) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }
}

impl<T> Clone for RuntimeMetricServiceServer<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> tonic::server::NamedService for RuntimeMetricServiceServer<T> {
    const NAME: &'static str = SERVICE_NAME;
}

/// Adapts one method of the implementation to tonic's `UnaryService`.
struct Unary<T, F>(Arc<T>, F);

impl<T, F, Req, Resp, Fut> tonic::server::UnaryService<Req> for Unary<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(Arc<T>, Req) -> Fut,
    Fut: Future<Output = Result<Resp, tonic::Status>> + Send + 'static,
    Resp: Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<tonic::Response<Resp>, tonic::Status>;
    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let fut = (self.1)(Arc::clone(&self.0), request.into_inner());
        Box::pin(async move { fut.await.map(tonic::Response::new) })
    }
}

impl<T, B> tonic::codegen::Service<http::Request<B>> for RuntimeMetricServiceServer<T>
where
    T: RuntimeMetricService,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        match req.uri().path() {
            GET_RUNTIME_METRIC => Box::pin(async move {
                let svc = Unary(inner, |t: Arc<T>, r: MetricRequest| async move {
                    t.get_runtime_metric(r).await
                });
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                    MetricResponse,
                    MetricRequest,
                >::default());
                Ok(grpc.unary(svc, req).await)
            }),
            LIST_SUPPORTED_METRICS => Box::pin(async move {
                let svc = Unary(
                    inner,
                    |t: Arc<T>, r: ListSupportedMetricsRequest| async move {
                        t.list_supported_metrics(r).await
                    },
                );
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                    ListSupportedMetricsResponse,
                    ListSupportedMetricsRequest,
                >::default());
                Ok(grpc.unary(svc, req).await)
            }),
            GET_TPU_RUNTIME_STATUS => Box::pin(async move {
                let svc = Unary(
                    inner,
                    |t: Arc<T>, r: GetTpuRuntimeStatusRequest| async move {
                        t.get_tpu_runtime_status(r).await
                    },
                );
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                    GetTpuRuntimeStatusResponse,
                    GetTpuRuntimeStatusRequest,
                >::default());
                Ok(grpc.unary(svc, req).await)
            }),
            _ => Box::pin(
                async move { Ok(tonic::Status::unimplemented("unknown method").into_http()) },
            ),
        }
    }
}
