module github.com/kefirdb/kefir

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0 // indirect
	github.com/anishathalye/porcupine v1.3.1 // indirect
	github.com/google/btree v1.1.3 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/tidwall/btree v1.8.2 // indirect
)
