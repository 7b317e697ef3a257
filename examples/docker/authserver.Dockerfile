# The example ForwardAuth server (e2e/cmd/authserver), built once into a small image.
# From the repository root:
#   docker build -f examples/docker/authserver.Dockerfile -t tierlimit-authserver:dev .
# docker-compose.yml builds it itself; examples/kubernetes/chain.yaml runs this image.
# The build needs no network: the server imports the standard library only.
FROM golang:1.25 AS build
WORKDIR /src
COPY go.mod ./
COPY e2e/go.mod e2e/go.sum e2e/
COPY e2e/fakeauth e2e/fakeauth
COPY e2e/cmd/authserver e2e/cmd/authserver
WORKDIR /src/e2e
RUN CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -o /out/authserver ./cmd/authserver

FROM scratch
COPY --from=build /out/authserver /authserver
USER 65534:65534
EXPOSE 9000
ENTRYPOINT ["/authserver", "-addr", ":9000"]
