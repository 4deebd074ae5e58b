// Entry point of the console test runner: Igi.Tests.exe [--vectors DIR] [--connection-file F] [--filter S].
using System;
using System.IO;

namespace Igi.Tests
{
    public static class Program
    {
        public static int Main(string[] args)
        {
            string vectorsDir = null;
            string connectionFile = Environment.GetEnvironmentVariable("IGI_CONNECTION_FILE");
            string filter = null;
            for (int i = 0; i < args.Length; i++)
            {
                string a = args[i];
                if (a == "--vectors" && i + 1 < args.Length) vectorsDir = args[++i];
                else if (a == "--connection-file" && i + 1 < args.Length) connectionFile = args[++i];
                else if (a == "--filter" && i + 1 < args.Length) filter = args[++i];
                else
                {
                    Console.Error.WriteLine("usage: Igi.Tests.exe [--vectors DIR] [--connection-file F] [--filter SUBSTRING]");
                    return 2;
                }
            }
            var runner = new TestRunner { Filter = filter };
            CodecTests.Register(runner);
            TransportTests.Register(runner);
            ClientUnitTests.Register(runner);
            StaleConnectionFileTests.Register(runner);
            NUnitAdapter.Register(runner, typeof(Program).Assembly);  // Tests/Runtime (the launcher; bundle tests need IGI_DAEMON_BUNDLE)
            StructuredTests.Register(runner);
            if (vectorsDir != null) ConformanceTests.Register(runner, vectorsDir);
            else runner.Skip("conformance", "no --vectors DIR given (ipc/vectors)");
            if (!string.IsNullOrEmpty(connectionFile)) LiveTests.Register(runner, connectionFile);
            else runner.Skip("live daemon tests", "no --connection-file given (nor IGI_CONNECTION_FILE); start a daemon with " +
                             "`.venv/bin/python -m igi_sdk.daemon --connection-file F` and pass F");
            return runner.Run() == 0 ? 0 : 1;
        }
    }
}
