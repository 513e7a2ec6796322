package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/publish"
)

// A service that must see every crash, survive restarts and run as several
// replicas joins a durable group. Every replica runs this with the same
// Name; each event is handled by one of them, a pod's events one at a time
// and in order.
func ExampleConsume() {
	js, stop := exampleServer()
	defer stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	handled := 0
	err := consumer.Consume(ctx, js, consumer.DurableOptions{
		Name:       "example-service",
		Filter:     consumer.Filter{Type: "ContainerDied"},
		DeliverAll: true, // a new group starts with the stored events
		Partitions: 1,    // one at a time, so that the output is in order
		OnDeadLetter: func(d consumer.DeadLetter) {
			log.Printf("gave up on event %d after %d deliveries: %v", d.Event.Sequence, d.Deliveries, d.Err)
		},
	}, func(ctx context.Context, e consumer.Event) error {
		// e.Sequence and e.ID identify the event across redeliveries.
		code, _ := e.ExitCode() // Data.ExitCode is a *int32: nil when not known
		fmt.Printf("%d %s %s exit code %d\n", e.Sequence, e.LifecycleType(), e.Subject, code)
		if handled++; handled == 2 {
			cancel()
		}
		return nil // acknowledged: the group never delivers it again
	})
	fmt.Println("Consume returned", err)
	// Output:
	// 2 ContainerDied default/web-0/app exit code 1
	// 5 ContainerDied default/web-0/app exit code 137
	// Consume returned <nil>
}

// Replay reads what is stored and returns: here every Lifecycle event of
// one pod.
func ExampleReplay() {
	js, stop := exampleServer()
	defer stop()

	err := consumer.Replay(context.Background(), js, consumer.Options{
		Filter: consumer.Filter{PodUID: examplePod},
	}, func(e consumer.Event) error {
		fmt.Println(e.Sequence, e.LifecycleType(), e.Data.Container.Name, e.Data.Container.Attempt)
		return nil
	})
	fmt.Println("Replay returned", err)
	// Output:
	// 1 ContainerStarted app 0
	// 2 ContainerDied app 0
	// 3 ContainerRemoved app 0
	// 4 ContainerStarted app 1
	// 5 ContainerDied app 1
	// Replay returned <nil>
}

// Subscribe follows the events as they come, in order, while it runs; it
// keeps no place on the server. Returning an error from the callback stops
// it.
func ExampleSubscribe() {
	js, stop := exampleServer()
	defer stop()

	errEnough := errors.New("enough")
	seen := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := consumer.Subscribe(ctx, js, consumer.Options{
		Filter:     consumer.Filter{Node: "node-1", Type: "ContainerStarted"},
		DeliverAll: true, // from the beginning instead of from now on
	}, func(e consumer.Event) error {
		fmt.Println(e.Sequence, e.LifecycleType(), e.Node, e.Subject)
		if seen++; seen == 2 {
			return errEnough
		}
		return nil
	})
	fmt.Println("Subscribe returned", err)
	// Output:
	// 1 ContainerStarted node-1 default/web-0/app
	// 4 ContainerStarted node-1 default/web-0/app
	// Subscribe returned enough
}

const examplePod = "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70"

// exampleServer starts an in-process NATS server with the pleg-bridge
// stream holding the two lives of one container, and returns a JetStream
// handle and a function that stops everything.
func exampleServer() (jetstream.JetStream, func()) {
	dir, err := os.MkdirTemp("", "consumer-example")
	if err != nil {
		log.Fatal(err)
	}
	s, err := natsembed.Start(natsembed.Options{DataDir: dir, Port: -1})
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	stop := func() {
		nc.Close()
		s.Shutdown()
		s.WaitForShutdown()
		os.RemoveAll(dir)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if _, err := publish.EnsureStream(ctx, js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		log.Fatal(err)
	}
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1", SubjectPrefix: "pleg"})
	if err != nil {
		log.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, exit := range []int32{1, 137} {
		c := generator.Container{ID: fmt.Sprintf("c%d", i), Name: "app", Attempt: uint32(i), Image: "registry.example/app:1.2"}
		pod := generator.Pod{UID: examplePod, Namespace: "default", Name: "web-0"}
		events := []generator.Event{
			{Type: generator.ContainerStarted, State: generator.StateRunning},
			{Type: generator.ContainerDied, State: generator.StateExited, ExitCode: &exit},
			{Type: generator.ContainerRemoved, State: generator.StateRemoved},
		}
		if i == 1 {
			events = events[:2] // the second one has not been removed yet
		}
		for _, e := range events {
			e.Pod, e.Container, e.Time, e.ObservedAt, e.DetectedBy = pod, c, at, at, generator.SourceRelist
			msg, err := enc.Encode(e)
			if err != nil {
				log.Fatal(err)
			}
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				log.Fatal(err)
			}
		}
	}
	return js, stop
}
