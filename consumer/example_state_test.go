package consumer_test

import (
	"context"
	"fmt"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// ListState lists what runs in one namespace now, across the cluster,
// from the bridges' state bucket.
func ExampleListState() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	containers, err := consumer.ListState(context.Background(), js, consumer.StateOptions{
		Filter: consumer.StateFilter{Namespace: "shop"},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range containers {
		d := c.Event.Data
		fmt.Println(c.Ref.Node, d.Pod.Name, d.Container.Name, d.State)
	}
}

// WatchState keeps a map of one node's containers up to date, as an
// informer does: the list first, then every change.
func ExampleWatchState() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	containers := map[string]consumer.ContainerState{}
	err = consumer.WatchState(context.Background(), js, consumer.StateOptions{
		Filter: consumer.StateFilter{Node: "node-1"},
	}, func(ch consumer.StateChange) error {
		switch ch.Op {
		case consumer.StateListed, consumer.StateUpdated:
			containers[ch.Container.Key] = ch.Container
		case consumer.StateRemoved:
			delete(containers, ch.Container.Key)
		case consumer.StateSynced:
			fmt.Println(len(containers), "containers on node-1")
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
