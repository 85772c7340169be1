package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/kefirdb/kefir/client"
)

// The package documentation's example, compiled so it cannot drift from the API.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, []string{"127.0.0.1:6380"}, client.WithPassword(os.Getenv("KEFIR_PASSWORD")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// A durable write, then a linearizable read.
	if err := c.Put(ctx, "greeting", []byte("hello"), client.WithDurability(client.Sync)); err != nil {
		log.Fatal(err)
	}
	v, err := c.Get(ctx, "greeting", client.WithConsistency(client.Linearizable))
	switch {
	case errors.Is(err, client.ErrNotFound):
		fmt.Println("no greeting")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println(string(v))
	}

	// Counters and compare-and-set.
	n, err := c.Incr(ctx, "visits", 1)
	fmt.Println(n, err)
	swapped, err := c.CAS(ctx, "greeting", []byte("hello"), []byte("hi"))
	fmt.Println(swapped, err)

	// A session reads its own writes even at a weaker level, on any node.
	s := c.Session()
	_ = s.Put(ctx, "cart", []byte("apples"), client.WithDurability(client.CAD))
	v, err = s.Get(ctx, "cart", client.WithConsistency(client.SessionConsistency))
	fmt.Println(string(v), err)

	// Ordered range reads: keys in ["user:", "user;"), at most 100.
	kvs, err := c.Scan(ctx, "user:", "user;", 100)
	if err != nil {
		log.Fatal(err)
	}
	for _, kv := range kvs {
		fmt.Printf("%s=%s\n", kv.Key, kv.Value)
	}
}
