package control_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every goroutine a Retriever or a rules database
// starts has ended once they are closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
