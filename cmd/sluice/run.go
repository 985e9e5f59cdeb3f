package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/peterbourgon/ff/v4"
	"github.com/peterbourgon/ff/v4/ffhelp"
)

// envPrefix prefixes the environment variable of every flag: --grpc-addr
// is also read from SLUICE_GRPC_ADDR.
const envPrefix = "SLUICE_"

// exitError ends sluice with an exit code; msg, if any, is printed first.
// An empty msg means the problem has been reported already.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.msg
}

// usageError is a mistake on the command line: exit status 2.
func usageError(format string, args ...any) error {
	return &exitError{code: 2, msg: fmt.Sprintf(format, args...)}
}

// run is sluice's main: it parses args (without the program name), reads
// each flag not given from the environment through getenv, and runs the
// subcommand until it is done or ctx is cancelled (serve shuts down
// gracefully then). Output goes to stdout, logs and errors to stderr.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	root := &ff.Command{
		Name:      "sluice",
		Usage:     "sluice <SUBCOMMAND> [FLAGS]",
		ShortHelp: "a distributed rate limiter",
		LongHelp: "Every flag can also be set through the environment: --grpc-addr as SLUICE_GRPC_ADDR,\n" +
			"and, for serve and proxy, in the YAML file --config names (grpc-addr: \":8081\").\n" +
			"Flags given on the command line win over the environment, and the environment over the file;\n" +
			"serve also reads Envoy ratelimit's variables (REDIS_URL, RUNTIME_ROOT, ...) when they are set,\n" +
			"below SLUICE_ variables and above the file.",
		Subcommands: []*ff.Command{
			serveCommand(stderr),
			proxyCommand(stderr),
			checkCommand(getenv, stdout, stderr),
			benchCommand(stdout),
			simulateCommand(stdout),
			versionCommand(stdout),
			rulesCommand(stdout),
			overrideCommand(stdout),
		},
	}
	addConfigFlag(root.Subcommands)
	root.Exec = func(context.Context, []string) error {
		fmt.Fprintln(stderr, ffhelp.Command(root))
		return usageError("no subcommand given")
	}
	if err := root.Parse(args); err != nil {
		sel := root.GetSelected()
		if sel == nil {
			sel = root
		}
		if errors.Is(err, ff.ErrHelp) {
			fmt.Fprintln(stdout, ffhelp.Command(sel))
			return nil
		}
		fmt.Fprintln(stderr, ffhelp.Command(sel))
		return usageError("%v", err)
	}
	sel := root.GetSelected()
	envoy, err := configure(sel.Name, sel.Flags, getenv)
	if err != nil {
		return err
	}
	if envoy != nil {
		if err := logEnvoy(stderr, sel.Flags, envoy); err != nil {
			return err
		}
	}
	return root.Run(ctx)
}

// envKey returns the environment variable of the flag called name:
// "grpc-addr" is SLUICE_GRPC_ADDR.
func envKey(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// applyEnv sets every flag of fs not given on the command line from its
// environment variable, if that is set and not empty.
func applyEnv(fs ff.Flags, getenv func(string) string) error {
	return fs.WalkFlags(func(f ff.Flag) error {
		name, ok := f.GetLongName()
		if !ok || f.IsSet() {
			return nil
		}
		key := envKey(name)
		v := getenv(key)
		if v == "" {
			return nil
		}
		if err := f.SetValue(v); err != nil {
			return fmt.Errorf("%s=%q: %w", key, v, err)
		}
		return nil
	})
}

// withEnv appends the flag's environment variable to its usage.
func withEnv(name, usage string) string {
	return usage + " ($" + envKey(name) + ")"
}
