// Sample: a game that ships the daemon bundle. Put the bundle folder (./dev.sh bundle -> build/bundle/igi-daemon)
// at Assets/StreamingAssets/igi-daemon/, add this component to a GameObject, assign an IgiNpcDialogue, press Play.
// The daemon starts with the game, is restarted if it dies (the NPC's saved conversation comes back), and stops
// when the game quits. Press S to save the conversation, T to talk, K to kill the daemon and watch it come back.
#if UNITY_5_3_OR_NEWER
using Igi.Unity;
using UnityEngine;

namespace Igi.Samples
{
    [RequireComponent(typeof(IgiConnection), typeof(IgiDaemonLauncher))]
    public sealed class ShippedDaemonNpc : MonoBehaviour
    {
        public IgiNpcDialogue npc;
        public string saveKey = "blacksmith";
        public string playerLine = "Can you fix my sword?";

        private IgiDaemonLauncher _launcher;

        private void Awake()
        {
            _launcher = GetComponent<IgiDaemonLauncher>();
            _launcher.onDaemonReady.AddListener(() => Debug.Log("[sample] daemon ready"));
            _launcher.onSessionRestored.AddListener((key, sessionId) =>
            {
                if (key == saveKey) npc.AdoptSession(sessionId);  // the conversation goes on where it was saved
            });
            npc.onReplyComplete.AddListener(text => Debug.Log("[sample] NPC: " + text));
            npc.onError.AddListener(message => Debug.LogWarning("[sample] " + message));
        }

        private async void Update()
        {
            if (Input.GetKeyDown(KeyCode.T)) npc.Say(playerLine);
            if (Input.GetKeyDown(KeyCode.S) && npc.SessionId != null)
            {
                string file = await _launcher.SaveSessionAsync(saveKey, npc.SessionId,
                    System.IO.Path.Combine(Application.persistentDataPath, saveKey + ".igisession"));
                Debug.Log("[sample] saved to " + file);
            }
            if (Input.GetKeyDown(KeyCode.K) && _launcher.Launcher != null && _launcher.Launcher.Pid != 0)
                System.Diagnostics.Process.GetProcessById(_launcher.Launcher.Pid).Kill();
        }
    }
}
#endif
