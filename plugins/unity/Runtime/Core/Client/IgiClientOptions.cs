// Layer: core/client. Tunables of IgiClient (timeouts, identity, transport factory).
using System;
using Igi.Transport;

namespace Igi.Client
{
    /// <summary>Options of <see cref="IgiClient"/>. Defaults suit a local daemon.</summary>
    public sealed class IgiClientOptions
    {
        /// <summary>hello_request.client_name.</summary>
        public string ClientName = "unity-plugin";

        /// <summary>hello_request.capabilities.</summary>
        public string[] Capabilities = { "token_stream", "reclaim", "frame_stats" };

        /// <summary>Time to wait for hello_reply, s.</summary>
        public double HelloTimeoutS = 15.0;

        /// <summary>
        /// Time to wait for hello_reply when the connection file names a daemon that is gone (a pid that does not run, or
        /// runs with another start time), s: a live daemon answers within milliseconds, so this only has to cover a pid of
        /// another pid namespace. Then <see cref="IgiStaleConnectionFileException"/>.
        /// </summary>
        public double StaleHelloTimeoutS = 1.0;

        /// <summary>Time to wait for the terminal reply of a non-generate request, s (load_model gets 10x).</summary>
        public double RequestTimeoutS = 30.0;

        /// <summary>Longest silence tolerated inside a generation (before the first token and between tokens), s.</summary>
        public double GenerateIdleTimeoutS = 120.0;

        /// <summary>Creates the transport; default: libzmq DEALER. Replace to plug in another socket library.</summary>
        public Func<IIgiTransport> TransportFactory = () => new ZmqDealerTransport();

        /// <summary>Diagnostics sink (dropped messages, late replies). Called from the I/O thread; must be thread-safe.</summary>
        public Action<string> Log;
    }
}
