// Conformance against the golden vectors of ipc/vectors (see ipc/README.md "How an implementation tests against them").
using System;
using System.Collections;
using System.Collections.Generic;
using System.IO;
using Igi.MsgPack;
using Igi.Protocol;

namespace Igi.Tests
{
    public static class ConformanceTests
    {
        private static List<MsgPackMap> Load(string path)
        {
            byte[] data = File.ReadAllBytes(path);
            var list = MsgPackReader.Decode(data, new MsgPackLimits { MaxInputBytes = 256 * 1024 * 1024 }) as IList;
            if (list == null) throw new InvalidDataException(path + " is not a msgpack array");
            var result = new List<MsgPackMap>();
            foreach (object o in list) result.Add((MsgPackMap)o);
            return result;
        }

        private static byte[][] Frames(MsgPackMap entry)
        {
            var frames = new List<byte[]>();
            foreach (object f in (IList)entry["frames"]) frames.Add((byte[])f);
            return frames.ToArray();
        }

        public static void Register(TestRunner runner, string dir)
        {
            string validPath = Path.Combine(dir, "vectors.msgpack");
            string invalidPath = Path.Combine(dir, "invalid.msgpack");
            string lenientPath = Path.Combine(dir, "lenient.msgpack");
            List<MsgPackMap> valid, invalid, lenient;
            try
            {
                valid = Load(validPath);
                invalid = Load(invalidPath);
                lenient = File.Exists(lenientPath) ? Load(lenientPath) : new List<MsgPackMap>();
            }
            catch (Exception e)
            {
                runner.Add("conformance:load_vectors", () => { throw new AssertionException("cannot load vectors from " + dir + ": " + e.Message); });
                return;
            }
            runner.Add("conformance:vector_files_not_empty", () =>
            {
                Check.True(valid.Count > 0, "vectors.msgpack has entries");
                Check.True(invalid.Count > 0, "invalid.msgpack has entries");
            });
            runner.Add("conformance:every_message_type_has_a_vector", () =>
            {
                var seen = new HashSet<string>();
                foreach (var v in valid) seen.Add((string)((MsgPackMap)v["header"])["type"]);
                foreach (string type in MessageRegistry.KnownTypes)
                    Check.True(seen.Contains(type), "a golden vector of type " + type);
                foreach (string type in seen)
                    Check.True(MessageRegistry.IsKnown(type), "the plugin knows vector type " + type);
            });
            foreach (var entry in valid)
            {
                var e = entry;
                runner.Add("conformance:valid:" + (string)e["name"], () => CheckValid(e));
            }
            foreach (var entry in lenient)
            {
                var e = entry;
                runner.Add("conformance:lenient:" + (string)e["name"], () => CheckLenient(e));
            }
            foreach (var entry in invalid)
            {
                var e = entry;
                runner.Add("conformance:invalid:" + (string)e["name"] + "->" + (string)e["expect"], () => CheckInvalid(e));
            }
            string connectionPath = Path.Combine(dir, "connection.msgpack");
            List<MsgPackMap> connection;
            try { connection = Load(connectionPath); }
            catch (Exception e)
            {
                runner.Add("conformance:load_connection_vectors", () => { throw new AssertionException("cannot load " + connectionPath + ": " + e.Message); });
                return;
            }
            foreach (var entry in connection)
            {
                var e = entry;
                runner.Add("conformance:connection:" + (string)e["name"], () => CheckConnection(e));
            }
        }

        // A connection file read as PROTOCOL.md 13 says: endpoint, mechanism and the PLAIN credential of section 1.5.
        private static void CheckConnection(MsgPackMap entry)
        {
            string file = (string)entry["file"];
            if ((string)entry["expect"] == "refused")
            {
                Check.Throws<Igi.IgiConnectionFileException>(() => Igi.Client.ConnectionInfo.Parse(file), "refused: " + file);
                return;
            }
            var info = Igi.Client.ConnectionInfo.Parse(file);
            Check.Equal((string)entry["endpoint"], info.Endpoint, "endpoint");
            Check.Equal((string)entry["zmq_mechanism"], info.ZmqMechanism, "zmq_mechanism");
            Check.Equal((string)entry["plain_username"], info.PlainUsername, "PLAIN username");
            byte[] password = info.PlainPassword;
            Check.Equal((string)entry["plain_password"], password == null ? null : System.Text.Encoding.ASCII.GetString(password), "PLAIN password");
        }

        private static void CheckValid(MsgPackMap entry)
        {
            var signer = new Signer((byte[])entry["key"]);
            byte[][] frames = Frames(entry);
            Check.Equal(4, frames.Length, "frame count");
            Check.True(signer.Verify(frames[1], frames[2], frames[3]), "signature verifies");
            Check.BytesEqual(frames[1], signer.Sign(frames[2], frames[3]), "re-signed signature");
            // Generic decode: same keys, same values, same order.
            Check.DeepEqual(entry["header"], MsgPackReader.Decode(frames[2]), "generic header");
            Check.DeepEqual(entry["content"], MsgPackReader.Decode(frames[3]), "generic content");
            // Typed decode, canonical re-encode, byte comparison.
            Envelope env = WireCodec.Decode(frames, signer);
            Check.Equal((string)((MsgPackMap)entry["header"])["type"], env.Message.Type, "typed message type");
            byte[][] again = WireCodec.Encode(env.Header, env.Message, signer);
            Check.BytesEqual(frames[0], again[0], "magic");
            Check.BytesEqual(frames[2], again[2], "re-encoded header");
            Check.BytesEqual(frames[3], again[3], "re-encoded content");
            Check.BytesEqual(frames[1], again[1], "re-encoded signature");
        }

        private static void CheckLenient(MsgPackMap entry)
        {
            var signer = new Signer((byte[])entry["key"]);
            Envelope env = WireCodec.Decode(Frames(entry), signer);
            var hw = new MsgPackWriter();
            env.Header.Write(hw);
            Check.BytesEqual(MsgPackWriter.Encode(entry["header"]), hw.ToArray(), "canonical header");
            Check.BytesEqual(MsgPackWriter.Encode(entry["content"]), env.Message.EncodeContent(), "canonical content");
        }

        private static void CheckInvalid(MsgPackMap entry)
        {
            var signer = new Signer((byte[])entry["key"]);
            string expect = (string)entry["expect"];
            var e = Check.Throws<IgiProtocolException>(() => WireCodec.Decode(Frames(entry), signer), "decode must fail");
            Check.Equal(expect, e.Classification, "classification (" + e.Message + ")");
        }
    }
}
