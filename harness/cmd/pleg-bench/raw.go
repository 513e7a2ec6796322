package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
)

// rawMaxPending bounds the raw publisher's messages awaiting an ack, as the
// bridge's publisher bounds its own (publish.DefaultMaxInFlight), with room
// to spare so that it never waits on it.
const rawMaxPending = 4 * publish.DefaultMaxInFlight

// rawPublisher is the throughput baseline: what any program that publishes
// a node's transitions must do at least. It reads the runtime's event
// stream with the generated client (decoding every message) and publishes,
// for each transition (a STARTED, STOPPED or DELETED event), a message as
// large as the bridge's CloudEvent with a message id, asynchronously to
// JetStream. It keeps no state and encodes nothing.
type rawPublisher struct {
	conn *grpc.ClientConn
	cli  runtimeapi.RuntimeServiceClient
	nc   *nats.Conn
	js   jetstream.JetStream
	node string
	body []byte // an encoded CloudEvent of a typical container
	sent atomic.Int64
}

// acked returns how many of the messages sent JetStream acked.
func (p *rawPublisher) acked() int {
	return int(p.sent.Load()) - p.js.PublishAsyncPending()
}

func newRawPublisher(ctx context.Context, spec childSpec) (*rawPublisher, error) {
	node := fmt.Sprintf("raw-%d", os.Getpid())
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: node, SubjectPrefix: "pleg"})
	if err != nil {
		return nil, err
	}
	now := time.Now()
	code := int32(0)
	sample, err := enc.Encode(generator.Event{
		Type: generator.ContainerDied, Time: now, State: generator.StateExited, ExitCode: &code, Reason: "Completed",
		Pod:       generator.Pod{UID: "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", Namespace: "team-1", Name: "app-1-5f7c9-00001"},
		Container: generator.Container{ID: fmt.Sprintf("%064x", 1), Name: "app", Image: "registry.example/team-1/app:1.1.0", ImageRef: "sha256:" + fmt.Sprintf("%064x", 2)},
		StartedAt: now, FinishedAt: now, ObservedAt: now, DetectedBy: generator.SourceEvented,
	})
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+spec.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(spec.NATSURL, nats.Name("pleg-bench raw"))
	if err != nil {
		conn.Close()
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(rawMaxPending))
	if err != nil {
		nc.Close()
		conn.Close()
		return nil, err
	}
	return &rawPublisher{conn: conn, cli: runtimeapi.NewRuntimeServiceClient(conn), nc: nc, js: js, node: node, body: sample.Data}, nil
}

func (p *rawPublisher) close() {
	p.nc.Close()
	p.conn.Close()
}

// run publishes until the stream ends or ctx is done.
func (p *rawPublisher) run(ctx context.Context) error {
	stream, err := p.cli.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		var typ string
		switch ev.GetContainerEventType() {
		case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
			typ = string(generator.ContainerStarted)
		case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
			typ = string(generator.ContainerDied)
		case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
			typ = string(generator.ContainerRemoved)
		default:
			continue
		}
		uid := ev.GetPodSandboxStatus().GetMetadata().GetUid()
		if uid == "" {
			uid = "unknown"
		}
		msg := &nats.Msg{Subject: "pleg." + p.node + "." + uid + "." + typ, Data: p.body, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, ev.GetContainerId()+"-"+typ)
		if _, err := p.js.PublishMsgAsync(msg); err != nil {
			return err
		}
		p.sent.Add(1)
	}
}
