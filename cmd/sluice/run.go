package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/peterbourgon/ff/v4"
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
	root := newRoot(getenv, stdout, stderr)
	if err := root.Parse(args); err != nil {
		sel := root.GetSelected()
		if sel == nil {
			sel = root
		}
		if errors.Is(err, ff.ErrHelp) {
			fmt.Fprintln(stdout, commandHelp(root, sel))
			return nil
		}
		return parseError(root, sel, args, err)
	}
	sel := root.GetSelected()
	if sel.Exec == nil {
		// A command of commands (rules, override): the next word was none.
		if rest := sel.Flags.GetArgs(); len(rest) > 0 {
			return unknownCommand(root, sel, rest[0])
		}
		return usageError("%swant a command: run `%s --help` for them", below(root, sel), strings.Join(commandPath(root, sel), " "))
	}
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

// newRoot returns sluice's tree of commands, whose output goes to stdout
// and stderr and which read the environment through getenv.
func newRoot(getenv func(string) string, stdout, stderr io.Writer) *ff.Command {
	var root *ff.Command
	root = &ff.Command{
		Name:      "sluice",
		Usage:     "sluice COMMAND [FLAGS]\nsluice help COMMAND",
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
			helpCommand(func() *ff.Command { return root }, stdout),
		},
	}
	addConfigFlag(root.Subcommands)
	root.Exec = func(_ context.Context, args []string) error {
		if len(args) > 0 {
			return unknownCommand(root, root, args[0])
		}
		fmt.Fprintf(stderr, "sluice: no command given\n\n%s\n", commandHelp(root, root))
		return &exitError{code: 2}
	}
	return root
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
